"""The served OpenAPI document takes a message exactly when the server does: text holding
something besides whitespace, controls and invisible characters (`_text.is_blank`, the rule the
runtime applies to prompts, messages and free-text answers), for a first and a sent message."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pydantic
import pytest
from pydantic.alias_generators import to_camel

import signoff as so
from signoff import Principal
from signoff._text import is_blank
from signoff.server import AsyncClient, TokenAuth, create_app
from signoff.server._models import CreateSession, SendMessage
from signoff.testing import store_contents

from .test_server_common import ADMIN, ALICE, TOKENS, make_runtime

# Lone surrogates are refused on their own account (not valid Unicode), and cannot reach a
# JSON Schema validator as text at all.
CHARS = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
SPACES = [c for c in CHARS if c.isspace()]
BLANK = [c for c in CHARS if is_blank(c)]
# Every character that says nothing, and its neighbours (where a range in the pattern ends).
_NEAR = {n for c in BLANK for n in range(ord(c) - 1, ord(c) + 2)}
EDGES = [chr(n) for n in sorted(_NEAR) if n >= 0 and not 0xD800 <= n <= 0xDFFF]
TEXTS = [
    *EDGES,
    "".join(SPACES),
    "".join(BLANK),
    " \n\t",
    "",
    "\x00",
    "\u200b\u200d\ufeff",
    "\U000e0041\U000e007f",
    "a",
    " a ",
    "\x1c.\x1c",
    "\u200ba",
]


def _taken(model: type[pydantic.BaseModel], body: dict[str, str]) -> bool:
    try:
        model.model_validate(body)
    except pydantic.ValidationError:
        return False
    return True


def test_the_schema_takes_a_message_exactly_when_the_server_does(tmp_path: Path) -> None:
    """Schemathesis drew `{"text": "\\n"}` as a valid body and got a 422: a schema that says
    less than the server checks lets clients (and generated tests) send what is refused."""
    app = create_app(make_runtime(f"sqlite:///{tmp_path / 'state.db'}"), auth=TokenAuth(TOKENS))
    schemas = app.openapi()["components"]["schemas"]
    sent = jsonschema_rs.validator_for(schemas["SendMessage"]["properties"]["text"])
    first = jsonschema_rs.validator_for(schemas["CreateSession"]["properties"]["message"])
    for text in TEXTS:
        said = not is_blank(text)
        assert sent.is_valid(text) is said, repr(text)
        assert _taken(SendMessage, {"text": text}) is said, repr(text)
        assert first.is_valid(text) is said, repr(text)
        assert _taken(CreateSession, {"agent": "support", "message": text}) is said, repr(text)
    assert first.is_valid(None) and _taken(CreateSession, {"agent": "support"})
    # The pattern, on every character: it needs one that `is_blank` does not pass over.
    assert [c for c in CHARS if sent.is_valid(c) is is_blank(c)] == []
    assert len(BLANK) > len(SPACES) and "\u200b" in BLANK and "\x00" in BLANK


def test_the_rule_is_not_only_whitespace() -> None:
    """What says nothing, independently of how `is_blank` reads it: whitespace, C0 and C1
    controls, zero-width and formatting characters, variation selectors and tag characters."""
    for c in ["\x00", "\x1f", "\x7f", "\x9f", "\xad", "\u200b", "\u2060", "\ufe0f", "\ufeff"]:
        assert is_blank(c), repr(c)
    assert is_blank("\U000e0001") and is_blank("\u3164") and is_blank(" \u00a0\u3000")
    for c in ["a", ".", "\u00e9", "\u4e00", "\U0001f600", "\ufffd", "\u0300"]:
        assert not is_blank(c), repr(c)


async def test_an_empty_agent_name_is_an_unknown_agent_as_in_process(tmp_path: Path) -> None:
    """`POST /v1/sessions` with `"agent": ""` was 422 `invalid_request` (the body's model asked
    for one character), so `Client.generate("", ...)` raised a bare `so.UsageError` where
    `Runtime.generate` raises `so.UnknownAgent` naming the agents there are: a caller catching
    `UnknownAgent` missed it. It is now the 422 `unknown_agent` any other name this server does
    not have is, and nothing is stored (the OpenAPI document's `enum` still names the agents)."""
    runtime = make_runtime(f"sqlite:///{tmp_path / 'state.db'}")
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
            for prompt in ("Refund order 1042", None):
                with pytest.raises(so.UnknownAgent) as local:
                    await runtime.generate("", prompt or "hi")
                with pytest.raises(so.UnknownAgent) as remote:
                    await c.generate("", prompt)
                assert "support" in str(remote.value) and "support" in str(local.value)
            r = await c.http.post("/v1/sessions", json={"agent": ""})
            assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_agent"
            assert await runtime.sessions() == []
    await runtime.close()


async def test_an_answer_is_refused_in_the_runtimes_order_not_by_its_body(
    tmp_path: Path,
) -> None:
    """The body model refused an answer with neither `optionId` nor `text`, and an empty
    request id, as 422 `invalid_request` before the session, the request or who answers was
    looked at: the admin (who may not answer alice's call), an unknown request and an unknown
    session were all told the answer's shape, and `AsyncClient` raised `InvalidAnswer` where
    `Runtime` raises `NotAllowed`, `UnknownRequest` or `UnknownSession` (README, "Who may
    answer is checked first"). Each is now the runtime's refusal, its status and code the
    API's for it, the same class from the client, the shape told last; nothing is stored."""
    runtime = make_runtime(f"sqlite:///{tmp_path / 'state.db'}")
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    gone = "ses_00000000000000000000"
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        clients = {
            p.principal_id: AsyncClient("http://t", token=token, transport=transport)
            for token, p in TOKENS.items()
            if p in (ALICE, ADMIN)
        }
        started = await clients[ALICE.principal_id].generate(
            "support", "Refund order 1042, it broke"
        )
        sid, rid = started.session_id, started.pending[0].id
        before = await store_contents(runtime.store, sid)
        no_answer = {"value": "ok"}
        cases: list[tuple[Principal, str, str, dict[str, Any], type[so.SignoffError], int]] = [
            (ADMIN, sid, "responses", {"request_id": rid, **no_answer}, so.NotAllowed, 403),
            (
                ALICE,
                sid,
                "responses",
                {"request_id": "req_nope", **no_answer},
                so.UnknownRequest,
                404,
            ),
            (ALICE, gone, "responses", {"request_id": rid, **no_answer}, so.UnknownSession, 404),
            (
                ALICE,
                sid,
                "responses",
                {"request_id": "", "option_id": "approve"},
                so.UnknownRequest,
                404,
            ),
            (
                ALICE,
                gone,
                "responses",
                {"request_id": "", "option_id": "approve"},
                so.UnknownSession,
                404,
            ),
            (ALICE, sid, "approvals", {"id": "", "approved": True}, so.UnknownRequest, 404),
            (ALICE, gone, "approvals", {"id": "", "approved": True}, so.UnknownSession, 404),
            (ALICE, sid, "responses", {"request_id": rid, **no_answer}, so.InvalidAnswer, 422),
        ]
        for principal, session_id, path, item, refusal, status in cases:
            said = (principal.principal_id, session_id, path, item)
            c = clients[principal.principal_id]
            if path == "responses":
                local = runtime.respond(session_id, [item], principal=principal)
                remote = c.respond(session_id, [item])
                body = {"inputResponses": [_camel(item)]}
            else:
                local = runtime.generate(session_id=session_id, approvals=[item], auth=principal)
                remote = c.generate(session_id=session_id, approvals=[item])
                body = {"approvals": [item]}
            for call in (local, remote):
                with pytest.raises(so.SignoffError) as raised:
                    await call
                assert type(raised.value) is refusal, (said, raised.value)
            r = await c.http.post(f"/v1/sessions/{session_id}/{path}", json=body)
            assert (r.status_code, r.json()["error"]["code"]) == (status, refusal.code), said
        assert "option_id must be" in str(raised.value)  # the shape, told last
        for c in clients.values():
            await c.aclose()
        assert await store_contents(runtime.store, sid) == before
    await runtime.close()


def _camel(item: dict[str, Any]) -> dict[str, Any]:
    return {to_camel(k): v for k, v in item.items()}
