"""Schemathesis against the served OpenAPI document, in process: no 5xx, responses match it."""

from __future__ import annotations

import atexit
import tempfile
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings

from signoff.server import TokenAuth, create_app

from .test_server_common import TOKENS, make_runtime

_dir = tempfile.TemporaryDirectory(prefix="signoff-schema-")
atexit.register(_dir.cleanup)
runtime = make_runtime(f"sqlite:///{Path(_dir.name) / 'state.db'}")
app = create_app(runtime, auth=TokenAuth(TOKENS))
# The event stream never ends while following; it is tested over real HTTP instead.
schema = schemathesis.openapi.from_asgi("/v1/openapi.json", app).exclude(
    path="/v1/sessions/{session_id}/events"
)

HEADERS = {"Authorization": "Bearer alice-token"}


@schema.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_api_conforms_to_its_schema(case: Any) -> None:
    case.call_and_validate(headers=HEADERS)
