"""The served OpenAPI links, followed one by one with Schemathesis' own evaluation of them: from
a created session and from the queue to the pending request and the answer that settles it.

The stateful exploration (tests/test_server_schema.py) follows them at random and may or may
not draw a whole create -> answer chain; this walks each such chain every time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemathesis.generation.stateful.state_machine import StepOutput
from schemathesis.specs.openapi.checks import ignored_auth

from signoff.server import TokenAuth, create_app

from .test_server_common import TOKENS, make_runtime
from .test_server_schema import HEADERS, APIWorkflow, stateful_schema

# Each agent whose request Alice can settle alone, with the link that answers it.
SETTLING = {"support": "ApprovePending", "helper": "AnswerFirstPending"}
FROM_A_TURN = {
    "GetSession",
    "GetFirstPendingRequest",
    "SendMessage",
    "Generate",
    "Cancel",
    *SETTLING.values(),
}


def _links(label: str) -> dict[str, Any]:
    return {link.name: link for link in APIWorkflow._transitions.operations[label].outgoing}


def _follow(link: Any, output: StepOutput, app: Any) -> StepOutput:
    """Call what `link` leads to with the values it takes from `output`, and check the answer
    against the document."""
    transition = link.extract(output)
    path = {
        name: extracted.value.ok()
        for name, extracted in transition.parameters.get("path_parameters", {}).items()
    }
    body = None if transition.request_body is None else transition.request_body.value.ok()
    if body is None and link.target.method == "post":
        body = {"text": "and one more thing"} if link.name == "SendMessage" else {}
    case = link.target.Case(path_parameters=path, body=body, media_type="application/json")
    response = case.call(headers=HEADERS, app=app)
    case.validate_response(
        response, excluded_checks=[ignored_auth], transport_kwargs={"headers": HEADERS, "app": app}
    )
    assert response.status_code == 200, (link.name, response.text)
    return StepOutput(response, case)


def _create(agent: str, app: Any) -> StepOutput:
    create = stateful_schema["/v1/sessions"]["POST"]
    body: dict[str, Any] = {"agent": agent, "message": "refund order 1042, it arrived broken"}
    case = create.Case(body=body, media_type="application/json")
    response = case.call(headers=HEADERS, app=app)
    assert response.status_code == 201, response.text
    return StepOutput(response, case)


def _settled(answered: StepOutput, output: StepOutput, app: Any) -> None:
    """The answer settled the request the chain started from, as `GET /v1/requests/{id}` says."""
    (outcome,) = answered.response.json()["outcomes"]
    assert outcome["applied"] and outcome["outcome"] in ("approved", "answered"), outcome
    request = _follow(_links(output.case.operation.label)["GetFirstPendingRequest"], output, app)
    assert request.response.json()["status"] == "settled", request.response.text


def test_links_from_a_created_session_settle_its_request(tmp_path: Path) -> None:
    """From `POST /v1/sessions`' 201, each link leads somewhere that answers 200, and the
    answering link settles the request the session waits on."""
    app = create_app(make_runtime(f"sqlite:///{tmp_path / 'links.db'}"), auth=TokenAuth(TOKENS))
    links = _links("POST /v1/sessions")
    assert FROM_A_TURN <= set(links), sorted(links)
    for agent, answer in SETTLING.items():
        created = _create(agent, app)
        viewed = _follow(links["GetSession"], created, app)
        assert viewed.response.json()["agent"] == agent
        again = _follow(_links("GET /v1/sessions/{session_id}")["GetSession"], viewed, app)
        assert again.response.json()["id"] == viewed.response.json()["id"]
        for source in (created, viewed):
            request = _follow(
                _links(source.case.operation.label)["GetFirstPendingRequest"], source, app
            )
            assert request.response.json()["status"] == "pending", request.response.text
        _settled(_follow(links[answer], created, app), created, app)
        # Resuming a turn that ended returns it as it stands.
        assert _follow(links["Generate"], created, app).response.json()["status"] == "completed"
        # After the answer the session's turn result links on: say more, then cancel.
        said = _follow(links["SendMessage"], created, app)
        _follow(_links("POST /v1/sessions/{session_id}/messages")["Cancel"], said, app)


def test_links_from_the_queue_settle_its_oldest_request(tmp_path: Path) -> None:
    """From `GET /v1/requests`' 200, the links lead to the oldest open request's session and
    answer it: the queue is where an approver starts."""
    app = create_app(make_runtime(f"sqlite:///{tmp_path / 'queue.db'}"), auth=TokenAuth(TOKENS))
    links = _links("GET /v1/requests")
    assert FROM_A_TURN - {"SendMessage", "Cancel"} <= set(links), sorted(links)
    queue = stateful_schema["/v1/requests"]["GET"]
    for agent, answer in SETTLING.items():
        _create(agent, app)
        case = queue.Case()
        response = case.call(headers=HEADERS, app=app)
        assert response.status_code == 200, response.text
        listed = StepOutput(response, case)
        assert _follow(links["GetSession"], listed, app).response.json()["agent"] == agent
        answered = _follow(links[answer], listed, app)
        (outcome,) = answered.response.json()["outcomes"]
        assert outcome["applied"] and outcome["outcome"] in ("approved", "answered"), outcome
        assert queue.Case().call(headers=HEADERS, app=app).json()["items"] == []
