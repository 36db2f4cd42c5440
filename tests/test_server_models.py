"""The served OpenAPI document takes a message exactly when the server does: text holding
something besides whitespace (as `str.isspace` reads it), for a first and a sent message."""

from __future__ import annotations

import sys
from pathlib import Path

import jsonschema_rs
import pydantic

from signoff.server import TokenAuth, create_app
from signoff.server._models import CreateSession, SendMessage

from .test_server_common import TOKENS, make_runtime

SPACES = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]
TEXTS = [*SPACES, "".join(SPACES), " \n\t", "", "\ufeff", "\u200b", "a", " a ", "\x1c.\x1c"]


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
        said = text.strip() != "" and not text.isspace()
        assert sent.is_valid(text) is said, repr(text)
        assert _taken(SendMessage, {"text": text}) is said, repr(text)
        assert first.is_valid(text) is said, repr(text)
        assert _taken(CreateSession, {"agent": "support", "message": text}) is said, repr(text)
    assert first.is_valid(None) and _taken(CreateSession, {"agent": "support"})
