"""OpenAPI links: how the ids in one response feed the next call, for clients and fuzzers."""

from __future__ import annotations

from typing import Any

__all__ = ["add_links"]

SESSION = "/v1/sessions/{session_id}"
TURN_RESULTS = [  # the calls that answer with a TurnResult (`session_id`, `pending`)
    ("/v1/sessions", "post", "201"),
    (f"{SESSION}/messages", "post", "200"),
    (f"{SESSION}/responses", "post", "200"),
    (f"{SESSION}/approvals", "post", "200"),
    (f"{SESSION}/generate", "post", "200"),
    (f"{SESSION}/cancel", "post", "200"),
]


def add_links(doc: dict[str, Any]) -> None:
    """Add `links` to the responses of `doc` that carry a session id or open requests."""
    paths = doc.get("paths", {})

    def op(path: str, method: str) -> str | None:
        found = paths.get(path, {}).get(method)
        return None if found is None else found.get("operationId")

    def follow(session: str, pending: str) -> dict[str, Any]:
        request = f"{pending}/0/id"
        first_option = f"$response.body#{pending}/0/options/0/id"  # `approve` for approvals
        targets = {
            "GetSession": (op(SESSION, "get"), None),
            "AnswerFirstPending": (
                op(f"{SESSION}/responses", "post"),
                {
                    "inputResponses": [
                        {"requestId": f"$response.body#{request}", "optionId": first_option}
                    ]
                },
            ),
            "ApprovePending": (
                op(f"{SESSION}/approvals", "post"),
                {"approvals": [{"id": f"$response.body#{request}", "approved": True}]},
            ),
            "SendMessage": (op(f"{SESSION}/messages", "post"), None),
            "Generate": (op(f"{SESSION}/generate", "post"), None),
            "Cancel": (op(f"{SESSION}/cancel", "post"), None),
        }
        links: dict[str, Any] = {}
        for name, (operation, body) in targets.items():
            if operation is None:
                continue
            link: dict[str, Any] = {
                "operationId": operation,
                "parameters": {"session_id": f"$response.body#{session}"},
            }
            if body is not None:
                link["requestBody"] = body
            links[name] = link
        get_request = op("/v1/requests/{request_id}", "get")
        if get_request is not None:
            links["GetFirstPendingRequest"] = {
                "operationId": get_request,
                "parameters": {"request_id": f"$response.body#{request}"},
            }
        return links

    def attach(path: str, method: str, status: str, links: dict[str, Any]) -> None:
        response = paths.get(path, {}).get(method, {}).get("responses", {}).get(status)
        if response is not None:
            response.setdefault("links", {}).update(links)

    for path, method, status in TURN_RESULTS:
        attach(path, method, status, follow("/session_id", "/pending"))
    attach(SESSION, "get", "200", follow("/id", "/pending"))
    attach("/v1/requests", "get", "200", follow("/items/0/session_id", "/items"))
