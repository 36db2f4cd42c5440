"""The OpenAPI document declares the bearer token the API's routes need, and only theirs; a
route it marks refuses a call without a valid token (401), and a client that sent too many
wrong ones (429), as documented. The schemathesis runs give the valid token and leave out their
wrong-token probe (tests/test_server_schema.py): this is where that is checked."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from signoff.server import TokenAuth, create_app
from signoff.server._throttle import PER_CLIENT

from .test_server_common import TOKENS, make_runtime

GOOD = {"Authorization": "Bearer alice-token"}
WRONG = {"Authorization": "Bearer not-a-token"}


def test_the_api_routes_and_only_they_declare_a_bearer_token(tmp_path: Path) -> None:
    app = create_app(make_runtime(f"sqlite:///{tmp_path / 'state.db'}"), auth=TokenAuth(TOKENS))
    doc = app.openapi()
    schemes = doc["components"]["securitySchemes"]
    assert list(schemes.values()) == [{"type": "http", "scheme": "bearer", **_described(schemes)}]
    (name,) = schemes
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            wanted: list[dict[str, list[str]]] | None = (
                [{name: []}] if path.startswith("/v1/") else None
            )
            assert operation.get("security") == wanted, (method, path)
    assert "/v1/sessions" in doc["paths"] and "/healthz" not in doc["paths"]
    dev = create_app(make_runtime(f"sqlite:///{tmp_path / 'dev.db'}"), dev=True).openapi()
    assert "securitySchemes" not in dev.get("components", {})
    assert all("security" not in op for item in dev["paths"].values() for op in item.values())


def _described(schemes: dict[str, dict[str, str]]) -> dict[str, str]:
    (scheme,) = schemes.values()
    return {"description": scheme["description"]}


def test_a_declared_route_wants_the_token_and_throttles_wrong_ones(tmp_path: Path) -> None:
    app = create_app(make_runtime(f"sqlite:///{tmp_path / 'state.db'}"), auth=TokenAuth(TOKENS))
    gets = [p for p, item in app.openapi()["paths"].items() if "get" in item and "{" not in p]
    assert gets == ["/v1/sessions", "/v1/requests"]
    with TestClient(app) as client:
        for path in gets:
            assert client.get(path, headers=GOOD).status_code == 200, path
            refused = client.get(path)  # no token: not a guess, never throttled
            assert refused.status_code == 401, path
            assert refused.json()["error"]["code"] == "unauthenticated"
        for i in range(PER_CLIENT):
            refused = client.get(gets[i % 2], headers=WRONG)
            assert refused.status_code == 401, i
            assert refused.json()["error"]["code"] == "unauthenticated"
        for headers in (WRONG, GOOD):  # held before any token is compared
            held = client.get(gets[0], headers=headers)
            assert held.status_code == 429, headers
            assert held.json()["error"]["code"] == "too_many_failures"
            assert int(held.headers["Retry-After"]) > 0
