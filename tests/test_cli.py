"""`signoff pending / approve / deny / events` against a SQLite store holding a parked session."""

from __future__ import annotations

import asyncio
import dataclasses
import http.server
import json
import queue
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.channels.webhooks import verify_webhook
from signoff.cli import app, local_principal
from signoff.testing import tool_results

ROOT = Path(__file__).resolve().parents[1]


@so.tool(approval=lambda input: input.amount > 100)
async def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, Any]:
    """Refund an order."""
    return {"refunded": amount}


def _answer(conversation: list[so.Message]) -> so.ModelResponse:
    last = conversation[-1]
    assert isinstance(last, so.ToolResultMessage)
    if isinstance(last.content, dict) and last.content.get("denied"):
        return so.ModelResponse(text=f"Not refunded: {last.content.get('reason')}.")
    if "approval" in last.content:  # approved with a reason: it sits beside the result
        reason = last.content["approval"]["reason"]
        return so.ModelResponse(
            text=f"Refunded {last.content['result']['refunded']:.2f} ({reason})."
        )
    return so.ModelResponse(text=f"Refunded {last.content['refunded']:.2f}.")


agent = so.Agent(
    name="support",
    model=so.models.Scripted(
        [
            so.ModelResponse(
                tool_calls=[
                    so.ToolCall(
                        name="issue_refund",
                        input={"order_id": "1042", "amount": 180, "reason": "broken"},
                    )
                ]
            ),
            _answer,
        ]
    ),
    tools=[issue_refund],
)

TARGET = "tests.test_cli:agent"


@so.tool(approval=so.always(approvers=2, expires_in=3600))
async def wire_money(to: str, amount: float) -> dict[str, Any]:
    """Send money."""
    return {"sent": amount, "to": to}


treasurer = so.Agent(
    name="treasurer",
    model=so.models.Scripted(
        [
            so.ModelResponse(
                tool_calls=[so.ToolCall(name="wire_money", input={"to": "ACME", "amount": 5000})]
            ),
            so.ModelResponse(text="Wired."),
        ]
    ),
    tools=[wire_money],
)


def _both(conversation: list[so.Message]) -> so.ModelResponse:
    results = [m for m in conversation if isinstance(m, so.ToolResultMessage)]
    said = [
        f"{r.call_id}: {'denied' if r.is_error else 'refunded'}"
        for r in sorted(results, key=lambda r: r.call_id)
    ]
    return so.ModelResponse(text="; ".join(said))


double = so.Agent(
    name="double",
    model=so.models.Scripted(
        [
            so.ModelResponse(
                tool_calls=[
                    so.ToolCall(
                        id=f"call_{order}",
                        name="issue_refund",
                        input={"order_id": order, "amount": 150, "reason": "broken"},
                    )
                    for order in ("1042", "1043")
                ]
            ),
            _both,
        ]
    ),
    tools=[issue_refund],
)


async def _four_eyes(ctx: so.ResponseContext) -> Literal["allowed", "rejected"]:
    """Anyone but the person whose turn asked may approve."""
    who, asker = ctx.response.principal, ctx.request.principal
    return "rejected" if who is None or who == asker else "allowed"


@so.tool(approval=so.ApprovalSpec(request=so.always(), response=_four_eyes))
async def deploy(env: str) -> str:
    """Deploy to an environment."""
    return f"deployed to {env}"


deployer = so.Agent(
    name="deployer",
    model=so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="deploy", input={"env": "prod"})]),
            so.ModelResponse(text="Deployed."),
        ]
    ),
    tools=[deploy],
)


class _Flaky:
    """Fails the first time it is called after a tool result, then answers."""

    def __init__(self) -> None:
        self.failed = False

    def __call__(self, conversation: list[so.Message]) -> so.ModelResponse:
        if not self.failed:
            self.failed = True
            raise so.ModelError("upstream timed out")
        return _answer(conversation)


flaky_step = _Flaky()
flaky = so.Agent(
    name="flaky",
    model=so.models.Scripted(
        [
            so.ModelResponse(
                tool_calls=[
                    so.ToolCall(
                        name="issue_refund",
                        input={"order_id": "1042", "amount": 180, "reason": "broken"},
                    )
                ]
            ),
            flaky_step,
        ]
    ),
    tools=[issue_refund],
)


def _picked(conversation: list[so.Message]) -> so.ModelResponse:
    last = conversation[-1]
    assert isinstance(last, so.ToolResultMessage)
    return so.ModelResponse(text=f"You chose {last.content['answer']}.")


sizer = so.Agent(
    name="sizer",
    model=so.models.Scripted(
        [
            so.ModelResponse(
                tool_calls=[
                    so.ToolCall(
                        name="ask_question",
                        input={
                            "question": "Which size?",
                            "options": [
                                {"label": "Small", "description": "The 250 g bag."},
                                {"label": "Large", "description": "The 1 kg bag."},
                            ],
                        },
                    )
                ]
            ),
            _picked,
        ]
    ),
    tools=[so.ask_question()],
)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


def park(url: str, auth: so.Principal | None = None) -> tuple[str, str]:
    """Run a turn to `waiting` in this process and return (session id, request id)."""
    rt = so.Runtime([agent], store=url)
    try:
        r = rt.generate_sync("support", "Refund order 1042", auth=auth)
        assert r.status == "waiting"
        return r.session_id, r.pending[0].id
    finally:
        rt.close_sync()


def log(url: str, session_id: str) -> list[so.Event]:
    rt = so.Runtime([], store=url)
    try:
        return rt.events_sync(session_id)
    finally:
        rt.close_sync()


def refunds_run(events: list[so.Event]) -> int:
    return sum(
        1
        for e in events
        if e.type == "tool.completed"
        and e.data["tool_name"] == "issue_refund"
        and e.data["status"] == "ok"
    )


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def refused_usage(result: Any) -> str:
    """The message of a command line refused as Click refuses one it parses (a misuse found
    before anything ran): exit status 2, the command's usage, the message in an error box,
    returned with its lines joined."""
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Usage: "), result.stderr
    assert "Traceback" not in result.output
    boxed = [ln.strip("│ ") for ln in result.stderr.splitlines() if ln.startswith("│")]
    return " ".join(boxed)


def test_pending_lists_the_parked_request(url: str) -> None:
    session_id, request_id = park(url)
    result = invoke("pending", "--store", url)
    assert result.exit_code == 0, result.output
    assert request_id in result.output
    assert session_id in result.output
    assert "issue_refund" in result.output
    assert "Pending requests (1)" in result.output

    as_json = invoke("pending", "--store", url, "--json")
    assert as_json.exit_code == 0
    rows = json.loads(as_json.stdout)
    assert [r["id"] for r in rows] == [request_id]
    assert rows[0]["action"]["input"] == {"order_id": "1042", "amount": 180.0, "reason": "broken"}
    assert rows[0]["status"] == "pending"


def test_pending_filters_and_empty_queue(url: str) -> None:
    park(url)
    for args in (["--tool", "lookup_order"], ["--agent", "billing"]):
        result = invoke("pending", "--store", url, *args)
        assert result.exit_code == 0
        assert "No pending requests." in result.output
    result = invoke("pending", "--store", url, "--tool", "issue_refund", "--json")
    assert len(json.loads(result.stdout)) == 1


def test_pending_leaves_out_what_can_no_longer_be_answered(url: str) -> None:
    """No sweep ran: a request past its deadline, or of a session past its TTL, is not listed."""

    @so.tool(approval=so.always(expires_in=0.05))
    async def issue_refund(order_id: str) -> dict[str, str]:
        """Refund an order."""
        return {"refunded": order_id}

    @so.tool(approval=so.always())
    async def reopen_order(order_id: str) -> dict[str, str]:
        """Reopen an order."""
        return {"reopened": order_id}

    agents = [
        so.Agent(
            name=name,
            model=so.models.Scripted(
                [so.ModelResponse(tool_calls=[so.ToolCall(name=tool, input={"order_id": "1"})])]
            ),
            tools=[issue_refund, reopen_order],
            limits=so.Limits(ttl=ttl),
        )
        for name, tool, ttl in (("billing", "issue_refund", None), ("desk", "reopen_order", 0.05))
    ]
    rt = so.Runtime(agents, store=url)
    try:
        for a in agents:
            assert rt.generate_sync(a.name, "refund 1042").status == "waiting"
    finally:
        rt.close_sync()
    time.sleep(0.1)
    result = invoke("pending", "--store", url)
    assert result.exit_code == 0, result.output
    assert "No pending requests." in result.output
    assert json.loads(invoke("pending", "--store", url, "--json").stdout) == []


def test_approve_without_runtime_records_the_decision_only(url: str) -> None:
    session_id, request_id = park(url)
    result = invoke("approve", request_id, "--store", url, "--reason", "looks fine")
    assert result.exit_code == 0, result.output
    assert f"approved {request_id}" in result.output
    assert f"--session {session_id}" in result.output
    events = log(url, session_id)
    settled = [e for e in events if e.type == "approval.settled"]
    assert len(settled) == 1
    assert settled[0].data["decision"] == "approve"
    assert settled[0].data["reason"] == "looks fine"
    assert settled[0].data["by"]["principal_id"] == local_principal().principal_id
    assert refunds_run(events) == 0  # recorded, not run: this process has no model
    assert json.loads(invoke("pending", "--store", url, "--json").stdout) == []

    # A process with the agent picks the turn up and the approved call runs once.
    rt = so.Runtime([agent], store=url)
    try:
        done = rt.generate_sync(session_id=session_id)
    finally:
        rt.close_sync()
    assert done.status == "completed", done.error
    assert done.text == "Refunded 180.00 (looks fine)."
    assert refunds_run(log(url, session_id)) == 1


def test_approve_without_runtime_of_one_of_two_requests_names_the_one_left(url: str) -> None:
    """With one call approved and one still asked, the turn has work (`running`: a worker can
    run the approved call) and still waits on a person: the command names the request left."""
    rt = so.Runtime([double], store=url)
    try:
        r = rt.generate_sync("double", "Refund both")
    finally:
        rt.close_sync()
    first, second = (p.id for p in r.pending)
    result = invoke("approve", first, "--store", url)
    assert result.exit_code == 0, result.output
    assert f"approved {first}" in result.output
    assert f"the turn still waits on: {second}" in result.output


desk = so.Agent(
    name="desk",
    model=so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="support", input={"message": "1042"})]),
            lambda conversation: so.ModelResponse(
                text=f"desk: {tool_results(conversation)[-1].content}"
            ),
        ]
    ),
    tools=[so.delegate("support")],
)


def test_approve_without_runtime_records_an_answer_to_a_subagents_mirror(url: str) -> None:
    # The request asked on the parent for its child: recorded in the child (where it belongs)
    # and closed on the parent, with no runtime, like any other record-only answer.
    rt = so.Runtime([desk, agent], store=url)
    try:
        r = rt.generate_sync("desk", "Refund order 1042")
        [mirror] = r.pending
        assert mirror.child is not None
        result = invoke("approve", mirror.id, "--store", url, "--reason", "fine")
        assert result.exit_code == 0, result.output
        assert f"approved {mirror.id}" in result.output
        child = log(url, mirror.child.session_id)
        assert [e.data["decision"] for e in child if e.type == "approval.settled"] == ["approve"]
        assert refunds_run(child) == 0  # recorded, not run
        assert json.loads(invoke("pending", "--store", url, "--json").stdout) == []
        done = rt.generate_sync(session_id=r.session_id)  # a process with the agents goes on
        assert done.status == "completed", done.error
        assert done.text == "desk: Refunded 180.00 (fine)."
        assert refunds_run(log(url, mirror.child.session_id)) == 1
    finally:
        rt.close_sync()


def test_approve_with_runtime_continues_the_turn_here(url: str) -> None:
    session_id, request_id = park(url)
    result = invoke("approve", request_id, TARGET, "--store", url)
    assert result.exit_code == 0, result.output
    assert f"approved {request_id}" in result.output
    assert "support: Refunded 180.00." in result.output
    assert refunds_run(log(url, session_id)) == 1

    again = invoke("approve", request_id, TARGET, "--store", url)
    assert again.exit_code == 0
    assert f"{request_id} was already approved; nothing changed." in again.output
    assert refunds_run(log(url, session_id)) == 1

    conflict = invoke("deny", request_id, "--store", url, "--reason", "changed my mind")
    assert conflict.exit_code == 1
    assert conflict.stderr.startswith("error: ConflictingAnswer: ")
    assert len(conflict.stderr.strip().splitlines()) == 1
    assert "Traceback" not in conflict.output


def test_deny_reason_reaches_the_model(url: str) -> None:
    session_id, request_id = park(url)
    result = invoke("deny", request_id, TARGET, "--store", url, "--reason", "over the limit")
    assert result.exit_code == 0, result.output
    assert f"denied {request_id}" in result.output
    assert "support: Not refunded: over the limit." in result.output
    events = log(url, session_id)
    assert refunds_run(events) == 0
    completed = [e for e in events if e.type == "tool.completed"]
    assert completed[0].data["status"] == "denied"
    assert completed[0].data["result"]["reason"] == "over the limit"


def test_only_the_asker_may_answer(url: str) -> None:
    alice = so.Principal(authenticator="web", principal_id="alice")
    session_id, request_id = park(url, auth=alice)
    before = len(log(url, session_id))
    result = invoke("approve", request_id, "--store", url)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: NotAllowed: ")
    assert request_id in result.stderr
    assert len(log(url, session_id)) == before  # nothing claimed
    assert len(json.loads(invoke("pending", "--store", url, "--json").stdout)) == 1


def test_answer_a_question_by_option_or_text(url: str) -> None:
    rt = so.Runtime([sizer], store=url)
    try:
        first = rt.generate_sync("sizer", "I want coffee")
        second = rt.generate_sync("sizer", "I want coffee")
    finally:
        rt.close_sync()
    assert first.status == second.status == "waiting"
    question = first.pending[0]
    assert question.kind == "question"
    listed = CliRunner().invoke(app, ["pending", "--store", url], env={"COLUMNS": "200"})
    assert "Which size? (1=Small, 2=Large) or free text" in listed.output

    picked = invoke("answer", question.id, "tests.test_cli:sizer", "--store", url, "--option", "2")
    assert picked.exit_code == 0, picked.output
    assert f"answered {question.id} with 2" in picked.output
    assert "sizer: You chose Large." in picked.output

    typed = invoke(
        "answer", second.pending[0].id, "tests.test_cli:sizer", "--store", url, "--text", "both"
    )
    assert typed.exit_code == 0, typed.output
    assert "sizer: You chose both." in typed.output

    neither = invoke("answer", question.id, "--store", url)
    expected = "Invalid value: answer takes exactly one of --option ID or --text TEXT"
    assert refused_usage(neither) == expected
    both = invoke("answer", question.id, "--store", url, "--option", "2", "--text", "x")
    assert refused_usage(both) == expected
    approve_question = invoke("approve", second.pending[0].id, "--store", url)
    assert approve_question.exit_code == 1
    assert approve_question.stderr.startswith("error: InvalidAnswer: ")
    assert "Traceback" not in approve_question.output


def test_events_prints_the_log(url: str) -> None:
    session_id, request_id = park(url)
    result = invoke("events", session_id, "--store", url)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    types = [line.split()[2] for line in lines]
    assert types[0] == "session.created"
    assert "input.requested" in types
    assert types[-1] == "turn.waiting"
    assert request_id in result.output

    as_json = invoke("events", session_id, "--store", url, "--json")
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(r["session_id"] == session_id and r["v"] == so.SCHEMA_VERSION for r in rows)

    tail = invoke("events", session_id, "--store", url, "--json", "--after", str(len(rows) - 1))
    assert [json.loads(line)["seq"] for line in tail.stdout.splitlines()] == [len(rows)]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["approve", "req_nope"], "UnknownRequest: no request 'req_nope'"),
        (["deny", "req_nope", "--reason", "x"], "UnknownRequest: no request 'req_nope'"),
        (["events", "ses_nope"], "UnknownSession: unknown session 'ses_nope'"),
        (["chat", "tests.no_such_module:runtime"], "UsageError: cannot import"),
        (["chat", "tests.test_cli:nothing"], "UsageError: module 'tests.test_cli' has no"),
        (["chat", "tests.test_cli:TARGET"], "UsageError: tests.test_cli:TARGET is a str"),
        (["chat", TARGET, "--agent", "billing"], "UnknownAgent: unknown agent 'billing'"),
        (["approve", "req_nope", TARGET], "UnknownRequest: no request 'req_nope'"),
        (["chat", TARGET, "--session", "ses_nope"], "UnknownSession: unknown session 'ses_nope'"),
    ],
)
def test_errors_are_one_red_line(url: str, args: list[str], error: str) -> None:
    park(url)
    result = invoke(*args, "--store", url)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: {error}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["chat", "no-colon"], "expected MODULE:ATTRIBUTE"),
        (["worker", "no-colon"], "expected MODULE:ATTRIBUTE"),
        (["serve", "no-colon"], "expected MODULE:ATTRIBUTE"),
        (["approve", "req_nope", "no-colon"], "expected MODULE:ATTRIBUTE"),
        (["chat", "tests.test_cli:sizer", "--as", "a:"], "--as takes"),
        (["approve", "req_nope", "--as", "a:"], "--as takes"),
        (["sessions", "--status", "bad"], "--status takes one of"),
        (["answer", "req_nope"], "answer takes exactly one of"),
    ],
)
def test_a_misused_command_line_is_its_usage_and_status_2(
    url: str, args: list[str], error: str
) -> None:
    """A value of the wrong form, or options that do not go together, found before anything
    runs, is refused as Click refuses a value out of range: the usage, the message, exit 2;
    the store is left as it was."""
    session_id, _ = park(url)
    before = log(url, session_id)
    result = invoke(*args, "--store", url)
    assert refused_usage(result).startswith(f"Invalid value: {error}"), result.stderr
    assert log(url, session_id) == before


def test_a_multi_line_error_is_still_one_red_line() -> None:
    store = f"postgresql://nobody@127.0.0.1:{_free_port()}/x"  # nothing listens there
    result = invoke("pending", "--store", store)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: StoreUnavailable: cannot connect to PostgreSQL")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_sessions_refuses_an_unknown_status(url: str) -> None:
    park(url)
    result = invoke("sessions", "--store", url, "--status", "waitin")
    assert refused_usage(result).startswith("Invalid value: --status takes one of idle, running, ")
    waiting = invoke("sessions", "--store", url, "--status", "waiting", "--json")
    assert [r["status"] for r in json.loads(waiting.stdout)] == ["waiting"]


@pytest.mark.parametrize("given", ["sqlite:///hub.db", "postgresql://db/hub"])
def test_serve_refuses_a_store_url_as_its_channel_state_file(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--channel-state` takes a file path: a URL, as `--store` takes, was made a relative path,
    so `sqlite:///hub.db` became the file `hub.db` in a new folder `sqlite:` of the working
    directory, where no other process looking for `hub.db` would find it."""
    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path}/state.db"
    hook = ("--webhook", "http://127.0.0.1:9/hook", "--webhook-secret", "s")
    result = invoke(
        "serve", TARGET, "--store", store, "--port", "0", *hook, "--channel-state", given
    )
    assert refused_usage(result) == (
        f"Invalid value: --channel-state takes the path of a SQLite file, not a URL: {given!r}"
    )
    assert list(tmp_path.iterdir()) == []


def test_serve_names_a_store_or_channel_state_it_cannot_open(tmp_path: Path) -> None:
    newer = tmp_path / "newer.db"
    conn = sqlite3.connect(newer)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO meta VALUES ('schema', '999')")
    conn.commit()
    conn.close()
    result = invoke("serve", TARGET, "--store", f"sqlite:///{newer}", "--port", "0")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: SchemaVersionError: "), result.output
    assert len(result.stderr.strip().splitlines()) == 1
    (tmp_path / "file").write_text("not a directory")
    store = f"sqlite:///{tmp_path}/state.db"
    with_channels = ("--port", "0", "--webhook", "http://127.0.0.1:9/hook", "--webhook-secret", "s")
    result = invoke(
        "serve",
        TARGET,
        "--store",
        store,
        *with_channels,
        "--channel-state",
        str(tmp_path / "file" / "hub.db"),
    )
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: StoreError: cannot open the channel state")
    folder = tmp_path / "channels"
    folder.mkdir()
    result = invoke(
        "serve", TARGET, "--store", store, *with_channels, "--channel-state", str(folder)
    )
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: StoreError: cannot open the channel state {folder}: it is a directory, not a "
        "file\n"
    )
    assert list(folder.iterdir()) == []


def test_a_response_policy_is_not_bypassed_by_recording_only(url: str) -> None:
    alice = so.Principal(authenticator="web", principal_id="alice")
    rt = so.Runtime([deployer], store=url)
    try:
        parked = rt.generate_sync("deployer", "Deploy prod", auth=alice)
    finally:
        rt.close_sync()
    (request,) = parked.pending
    before = len(log(url, parked.session_id))
    # without the runtime the policy cannot run: the answer is refused, not recorded past it
    alone = invoke("approve", request.id, "--store", url, "--as", "web:alice")
    assert alone.exit_code == 1, alone.output
    assert alone.stderr.startswith("error: UsageError: "), alone.stderr
    assert "response policy" in alone.stderr and "MODULE:RUNTIME" in alone.stderr
    assert len(log(url, parked.session_id)) == before
    # with the runtime the policy decides: the asker is refused, and told so (not "already")
    refused = invoke(
        "approve", request.id, "tests.test_cli:deployer", "--store", url, "--as", "web:alice"
    )
    assert refused.exit_code == 1, refused.output
    assert "not accepted (rejected)" in refused.stderr
    assert "already" not in refused.output
    assert [r["id"] for r in json.loads(invoke("pending", "--store", url, "--json").stdout)] == [
        request.id
    ]
    allowed = invoke(
        "approve", request.id, "tests.test_cli:deployer", "--store", url, "--as", "web:bob"
    )
    assert allowed.exit_code == 0, allowed.output
    assert "deployer: Deployed." in allowed.output


def test_a_request_recorded_before_its_policy_flag_is_still_not_settled_by_recording_only(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request stored by a version before `InputRequest.response_policy` does not carry the
    flag: the tool's setting in the audit trail still says a response policy decides, so the
    record-only path refuses it all the same."""
    from signoff.stores import SQLiteStore

    alice = so.Principal(authenticator="web", principal_id="alice")
    rt = so.Runtime([deployer], store=url)
    try:
        parked = rt.generate_sync("deployer", "Deploy prod", auth=alice)
    finally:
        rt.close_sync()
    (request,) = parked.pending
    before = len(log(url, parked.session_id))
    real = SQLiteStore.get_request

    async def unflagged(self: SQLiteStore, request_id: str) -> Any:
        stored = await real(self, request_id)
        if stored is None:
            return None
        old = stored.request.model_copy(update={"response_policy": False})
        return dataclasses.replace(stored, request=old)

    monkeypatch.setattr(SQLiteStore, "get_request", unflagged)
    alone = invoke("approve", request.id, "--store", url, "--as", "web:alice")
    assert alone.exit_code == 1, alone.output
    assert alone.stderr.startswith("error: UsageError: "), alone.stderr
    assert "response policy" in alone.stderr and "MODULE:RUNTIME" in alone.stderr
    monkeypatch.undo()
    assert len(log(url, parked.session_id)) == before


def test_bad_store_url_is_a_usage_error() -> None:
    result = invoke("pending", "--store", "mysql://db/x")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: UsageError: unknown store URL 'mysql://db/x'")


def test_reading_commands_refuse_a_sqlite_store_that_does_not_exist(tmp_path: Path) -> None:
    typo = tmp_path / "sate.db"
    for args in (
        ["pending"],
        ["sessions"],
        ["events", "ses_x"],
        ["approve", "req_x"],
        ["deny", "req_x"],
        ["answer", "req_x", "--text", "hi"],
    ):
        result = invoke(*args, "--store", f"sqlite:///{typo}")
        assert result.exit_code == 1, (args, result.output)
        assert result.stderr.startswith(f"error: UsageError: no store at {typo}"), result.stderr
        assert not typo.exists(), args


def test_store_from_environment(url: str) -> None:
    _, request_id = park(url)
    result = CliRunner().invoke(app, ["pending", "--json"], env={"SIGNOFF_STORE": url})
    assert [r["id"] for r in json.loads(result.stdout)] == [request_id]


def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "signoff", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"signoff {so.__version__}"


@pytest.mark.parametrize("command", ["chat", "serve", "worker", "db upgrade"])
def test_help_keeps_each_paragraph_of_a_docstring_whole(command: str) -> None:
    """`--help` rewraps a command's description to the terminal: the docstring's own line
    breaks are not kept, so no line ends mid-sentence, however wide the terminal."""
    import inspect

    from signoff.cli import _chat, _serve, _worker

    callback = {
        "chat": _chat.chat,
        "serve": _serve.serve,
        "worker": _worker.worker,
        "db upgrade": _worker.db_upgrade,
    }[command]
    paragraphs = [" ".join(p.split()) for p in (inspect.getdoc(callback) or "").split("\n\n")]
    shown = CliRunner().invoke(app, [*command.split(), "--help"], env={"COLUMNS": "1000"})
    assert shown.exit_code == 0, shown.output
    lines = [line.strip() for line in shown.output.splitlines()]
    for paragraph in paragraphs:
        assert paragraph in lines, (paragraph, shown.output)


def test_acting_as_the_asker_settles(url: str) -> None:
    alice = so.Principal(authenticator="web", principal_id="alice")
    session_id, request_id = park(url, auth=alice)
    result = invoke("approve", request_id, TARGET, "--store", url, "--as", "web:alice")
    assert result.exit_code == 0, result.output
    assert "support: Refunded 180.00." in result.output
    settled = next(e for e in log(url, session_id) if e.type == "approval.settled")
    assert settled.data["by"]["authenticator"] == "web"
    assert settled.data["by"]["principal_id"] == "alice"

    bad = invoke("deny", request_id, "--store", url, "--as", ":nobody")
    assert refused_usage(bad).startswith("Invalid value: --as takes AUTHENTICATOR:ID")


def test_chat_resumes_a_parked_session_and_checks_who_answers(url: str) -> None:
    alice = so.Principal(authenticator="web", principal_id="alice")
    session_id, request_id = park(url, auth=alice)
    args = ["chat", TARGET, "--session", session_id, "--store", url]

    refused = CliRunner().invoke(app, args, input="y\n")
    assert refused.exit_code == 0, refused.output
    assert 'Run issue_refund({"order_id":"1042","amount":180,"reason":"broken"})? (y/N)' in (
        refused.output
    )
    assert "NotAllowed" in refused.output
    assert refunds_run(log(url, session_id)) == 0
    assert [r["id"] for r in json.loads(invoke("pending", "--store", url, "--json").stdout)] == [
        request_id
    ]

    accepted = CliRunner().invoke(app, [*args, "--as", "web:alice"], input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert 'issue_refund -> {"refunded":180}' in accepted.output
    assert "support: Refunded 180.00." in accepted.output
    assert refunds_run(log(url, session_id)) == 1


def test_chat_hands_a_two_person_approval_to_someone_else(url: str) -> None:
    chat = CliRunner().invoke(
        app, ["chat", "tests.test_cli:treasurer", "--store", url], input="pay ACME\ny\n"
    )
    assert chat.exit_code == 0, chat.output
    assert "needs 2 approvals; approved by nobody yet" in chat.output
    assert re.search(r"expires in (59m|1h); then it is denied", chat.output)
    assert "the turn waits for other people to answer" in chat.output
    (row,) = json.loads(invoke("pending", "--store", url, "--json").stdout)
    assert row["approved_by"] == [local_principal().principal_id]

    trail = CliRunner().invoke(
        app, ["events", row["session_id"], "--store", url], env={"COLUMNS": "200"}
    )
    me = local_principal().principal_id
    assert re.search(rf"approval\.candidate +{row['id']} approve by {me}: \w+", trail.output)

    second = invoke("approve", row["id"], "tests.test_cli:treasurer", "--store", url, "--as", "bob")
    assert second.exit_code == 0, second.output
    assert "treasurer: Wired." in second.output
    assert json.loads(invoke("pending", "--store", url, "--json").stdout) == []


def test_approve_that_continues_a_turn_which_then_fails_exits_1(url: str) -> None:
    """The answer is recorded, but the turn this command went on to run failed: a script must
    not read that as success (it exited 0, the failure a line on stdout among the others)."""
    flaky_step.failed = False
    rt = so.Runtime([flaky], store=url)
    try:
        parked = rt.generate_sync("flaky", "Refund order 1042")
    finally:
        rt.close_sync()
    request_id = parked.pending[0].id
    result = invoke("approve", request_id, "tests.test_cli:flaky", "--store", url)
    assert result.exit_code == 1, result.output
    assert f"approved {request_id}" in result.stdout
    assert result.stderr == (
        "error: the turn failed: ModelError: upstream timed out; it resumes with signoff chat "
        f"tests.test_cli:flaky --session {parked.session_id} --store {url}\n"
    )
    assert json.loads(invoke("pending", "--store", url, "--json").stdout) == []
    assert refunds_run(log(url, parked.session_id)) == 1


def test_chat_retries_a_failed_turn_without_asking_again(url: str) -> None:
    flaky_step.failed = False
    chat = CliRunner().invoke(
        app, ["chat", "tests.test_cli:flaky", "--store", url], input="refund 1042\ny\n/retry\n"
    )
    assert chat.exit_code == 0, chat.output
    assert "the turn failed: ModelError: upstream timed out (type /retry to resume it)" in (
        chat.output
    )
    assert "flaky: Refunded 180.00." in chat.output
    assert chat.output.count("(y/N)") == 1  # the approval was kept across the failure
    assert chat.output.count("issue_refund -> ") == 1  # and the refund ran once


def test_chat_asks_each_gated_call_of_one_step_in_turn(url: str) -> None:
    chat = CliRunner().invoke(
        app,
        ["chat", "tests.test_cli:double", "--store", url],
        input="refund both\ny\nn\nonly one\n",
    )
    assert chat.exit_code == 0, chat.output
    assert chat.output.count("(y/N)") == 2
    assert 'Run issue_refund({"order_id":"1042"' in chat.output
    assert 'Run issue_refund({"order_id":"1043"' in chat.output
    assert "double: call_1042: refunded; call_1043: denied" in chat.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


PROVIDER_VARIABLES = ("SIGNOFF_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY")


class WebhookReceiver:
    """A loopback HTTP server that keeps the verified payload of every webhook delivery."""

    def __init__(self, secret: str = "s3cret") -> None:
        received: queue.Queue[dict[str, Any]] = queue.Queue()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.put(verify_webhook(secret, dict(self.headers), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.received = received
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def wait_for(self, event: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            payload = self.received.get(timeout=max(0.01, deadline - time.monotonic()))
            if payload["type"] == event:
                return payload

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_serve_then_approve_from_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in PROVIDER_VARIABLES:  # the example's offline demo model, here and in the server
        monkeypatch.delenv(name, raising=False)
    url = f"sqlite:///{tmp_path}/state.db"
    port = _free_port()
    hooks = WebhookReceiver()
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("signoff")), "serve", "examples.support:runtime"]
        + ["--port", str(port), "--store", url]
        + ["--webhook", hooks.url, "--webhook-secret", "s3cret"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        banner = server.stdout.readline()
        assert f"dashboard at http://127.0.0.1:{port}/_signoff" in banner
        base = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/openapi.json", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.05)
        created = httpx.post(
            f"{base}/sessions",
            json={"agent": "support", "message": "refund order 1042, it arrived broken"},
            timeout=10,
        )
        assert created.status_code == 201, created.text
        body = created.json()
        assert body["status"] == "waiting"
        session_id = body["session_id"]
        pending = json.loads(invoke("pending", "--store", url, "--json").stdout)
        assert [p["session_id"] for p in pending] == [session_id]
        request_id = pending[0]["id"]
        opened = hooks.wait_for("request.opened")  # the --webhook channel, signed
        assert opened["request"]["id"] == request_id
        asker = pending[0]["requested_by"]

        result = invoke(
            "approve",
            request_id,
            "examples.support:runtime",
            "--store",
            url,
            "--as",
            f"{asker['authenticator']}:{asker['principal_id']}",
        )
        assert result.exit_code == 0, result.output
        assert "support: Done. I've refunded 180.00 for order 1042" in result.output

        seen = httpx.get(f"{base}/sessions/{session_id}", timeout=10)
        assert seen.status_code == 200
        assert "Done. I've refunded 180.00" in seen.text
        assert json.loads(invoke("pending", "--store", url, "--json").stdout) == []
        resolved = hooks.wait_for("request.resolved")
        assert resolved["request"]["id"] == request_id
    finally:
        hooks.close()
        server.terminate()
        server.wait(timeout=30)
        if server.stdout is not None:
            server.stdout.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--webhook", "http://127.0.0.1:9/hook"], "--webhook needs --webhook-secret"),
        (["--webhook-secret", "s3cret"], "no --webhook URL"),
        (["--webhook-backfill"], "--webhook-backfill is given but no --webhook URL"),
        (["--webhook", "ftp://example/hook", "--webhook-secret", "s"], "must be http(s)"),
        (["--slack-channel", "C0123"], "--slack-channel needs --slack-token"),
        (["--slack-channel", "C0123", "--slack-token", "xoxb-1"], "--slack-signing-secret"),
        (["--slack-token", "xoxb-1"], "--slack-token is given but no --slack-channel"),
        (["--slack-signing-secret", "s"], "--slack-signing-secret is given but no --slack-channel"),
        (["--channel-state", "hub.db"], "--channel-state is given but no --webhook or --slack"),
    ],
)
def test_serve_refuses_incomplete_channel_options(
    args: list[str], message: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import uvicorn

    for name in ("SIGNOFF_WEBHOOK_SECRET", "SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET"):
        monkeypatch.delenv(name, raising=False)
    started: list[Any] = []  # a server wrongly started must not listen until the test times out
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    store = f"sqlite:///{tmp_path}/state.db"
    result = invoke("serve", "examples.support:runtime", "--store", store, *args)
    assert message in refused_usage(result)
    assert started == [] and list(tmp_path.iterdir()) == []


def test_serve_ignores_channel_secrets_exported_for_channels_it_does_not_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A secret exported in the environment (for another command, or a later run) is not an
    error without its channel; the same secret given on the command line is (see above)."""
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self.config.app))
    monkeypatch.setenv("SIGNOFF_WEBHOOK_SECRET", "s3cret")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-1")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s")
    result = invoke("serve", "examples.support:runtime", "--store", f"sqlite:///{tmp_path}/s.db")
    assert result.exit_code == 0, result.output
    assert len(served) == 1


@pytest.mark.parametrize("how", ["option", "env"])
def test_serve_keys_the_dashboards_csrf_tokens_with_its_secret(
    how: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Processes serving one dashboard must share the secret of its CSRF tokens: `--secret`
    (or SIGNOFF_SECRET) gives it to `signoff serve`."""
    import uvicorn

    from signoff.server._pages import csrf_key

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self.config.app))
    args = ["serve", "examples.support:runtime", "--store", f"sqlite:///{tmp_path}/s.db"]
    if how == "option":
        args += ["--secret", "shared"]
    else:
        monkeypatch.setenv("SIGNOFF_SECRET", "shared")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert served[0].state.signoff.secret == csrf_key("shared")


@pytest.mark.parametrize("secret", ["", "s\udcff"])  # unset; a byte that is not UTF-8
def test_serve_refuses_an_empty_secret_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, secret: str
) -> None:
    """`--secret "$UNSET"` (or one holding a byte that is not UTF-8, which was a
    UnicodeEncodeError traceback) is a misused command line, and the server does not start."""
    import uvicorn

    started: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    store = f"sqlite:///{tmp_path}/s.db"
    result = invoke("serve", "examples.support:runtime", "--store", store, "--secret", secret)
    assert refused_usage(result).startswith("Invalid value: the server's secret")
    assert started == [] and list(tmp_path.iterdir()) == []


bracketed = so.Agent(
    name="ops [eu] [/x]",
    model=so.models.Scripted([so.ModelResponse(text="done [/] here")], repeat_last=True),
)


def test_names_with_brackets_are_printed_as_they_are(url: str) -> None:
    """An agent's name is not Rich markup: `sessions` and `chat` print `ops [eu] [/x]` as it is
    instead of failing with a MarkupError traceback."""
    result = CliRunner().invoke(
        app, ["chat", "tests.test_cli:bracketed", "--store", url], input="hello\n"
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert "ops [eu] [/x]: done [/] here" in result.output
    listed = invoke("sessions", "--store", url)
    assert listed.exit_code == 0, (listed.output, listed.exception)
    assert "ops [eu] [/x]" in listed.output


def offline_runtime() -> so.Runtime:
    """A runtime that leaves its turns to workers, with settings of its own."""
    clock = time.time
    return so.Runtime(
        [agent],
        store="sqlite:///:memory:",
        clock=clock,
        inline=False,
        lease_ttl=7.0,
        lease_wait=3.0,
        poll_interval=0.3,
    )


def test_store_option_replaces_only_the_store(url: str) -> None:
    """`--store` (or SIGNOFF_STORE) moves the runtime to another store and keeps the rest: a
    runtime that leaves its turns to workers (`inline=False`) still does under `signoff serve`."""
    from signoff.cli._app import load_runtime

    moved = load_runtime("tests.test_cli:offline_runtime", url)
    assert moved.store.url == url
    assert moved.inline is False
    assert (moved.lease_ttl, moved.lease_wait, moved.poll_interval) == (7.0, 3.0, 0.3)
    assert moved.clock is time.time
    assert load_runtime("tests.test_cli:offline_runtime").inline is False


def test_the_store_password_is_never_printed(pg_store_url: str) -> None:
    """A PostgreSQL password, in the user part or as `?password=`, stays out of what the CLI
    prints (an unknown request's error, chat's header) and of the worker's log line."""
    host = pg_store_url.split("@", 1)[1]
    for store in (f"postgresql://postgres:s3cret@{host}", f"{pg_store_url}?password=s3cret"):
        result = invoke("approve", "req_nope", "--store", store)
        assert result.exit_code == 1, result.output
        assert "UnknownRequest: no request 'req_nope' in postgresql://" in result.stderr
        assert "s3cret" not in result.output, result.output
        chat = CliRunner().invoke(app, ["chat", TARGET, "--store", store], input="/exit\n")
        assert chat.exit_code == 0, chat.output
        assert "store postgresql://postgres@" in chat.output
        assert "s3cret" not in chat.output, chat.output
    from signoff.cli._app import shown_store  # what the worker logs

    for store in (f"postgresql://postgres:s3cret@{host}", f"{pg_store_url}?password=s3cret"):
        assert "s3cret" not in shown_store(store) and host.split("/")[0] in shown_store(store)
    assert shown_store("sqlite:///x/state.db") == "sqlite:///x/state.db"


def test_serve_started_while_postgres_is_down_waits_for_it(tmp_path: Path) -> None:
    """`signoff serve` started before its database waits for it, saying so on stderr (no
    traceback), then serves; SIGTERM while it waits ends it at once, with status 0."""
    import os
    import signal

    from .conftest import PgCluster

    cluster = PgCluster.start()
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    try:
        cluster.halt()
        ports = [_free_port(), _free_port()]
        for i, port in enumerate(ports):
            out = tmp_path / f"serve-{i}.log"
            with out.open("wb") as f:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "signoff", "serve", TARGET, "--port", str(port)]
                    + ["--store", cluster.admin_url],
                    cwd=ROOT,
                    env=env,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                )
            procs.append((proc, out))
        for proc, out in procs:
            deadline = time.monotonic() + 30
            while "waiting for the store" not in out.read_text():
                assert proc.poll() is None, out.read_text()
                assert time.monotonic() < deadline, out.read_text()
                time.sleep(0.05)
        stopped, stopped_out = procs[1]
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(timeout=5) == 0, stopped_out.read_text()
        cluster.resume()
        proc, out = procs[0]
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, out.read_text()
            try:
                httpx.get(f"http://127.0.0.1:{ports[0]}/v1/openapi.json", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, out.read_text()
                time.sleep(0.05)
        assert "the store is up" in out.read_text()
        assert "Traceback" not in out.read_text()
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(timeout=10)
        cluster.stop()


def test_a_store_url_with_signoffs_own_options_is_shown_with_them() -> None:
    """`?schema=` and `?pool_max=` are signoff's, not libpq's: the worker's log line and the
    `--store` of a printed command show the store with them (a schema names another store),
    not as an unparsable URL, and still without the password."""
    from signoff.cli._app import shown_store

    url = "postgresql://app:s3cret@db.example:5433/prod?schema=tenant_a&pool_max=12"
    assert shown_store(url) == "postgresql://app@db.example:5433/prod?schema=tenant_a&pool_max=12"
    assert shown_store(f"{url}&password=s3cret") == shown_store(url)


@pytest.mark.parametrize("item", ["s3cret-without-a-principal", "s3cret-value=", "tök€n=alice"])
def test_serve_names_no_secret_in_a_token_error(
    item: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A mistyped `--token` is refused by its position: the error (in a terminal's scrollback, a
    service's log) does not repeat the secret, and the server does not start."""
    import uvicorn

    started: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    store = f"sqlite:///{tmp_path}/s.db"
    args = ["--token", "alice-token=alice", "--token", item]
    result = invoke("serve", "examples.support:runtime", "--store", store, *args)
    assert "#2" in refused_usage(result), result.output
    secret = item.partition("=")[0]
    assert secret not in result.output and "alice-token" not in result.output
    assert started == []


def test_db_upgrade_says_what_it_did_on_sqlite(tmp_path: Path) -> None:
    """Created on a new file, up to date on the same file again, upgraded from an older mark;
    it said "up to date" after creating the schema."""
    from signoff.stores.sqlite import STORE_SCHEMA

    url = f"sqlite:///{tmp_path}/state.db"
    result = invoke("db", "upgrade", "--store", url)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"schema created (version {STORE_SCHEMA})"), result.output
    result = invoke("db", "upgrade", "--store", url)
    assert result.output.startswith(f"schema is up to date (version {STORE_SCHEMA})")
    older = max(2, STORE_SCHEMA - 1)  # schema 1 files have rows of another shape
    with sqlite3.connect(tmp_path / "state.db") as conn:
        conn.execute("UPDATE meta SET value=? WHERE key='schema'", (str(older),))
    conn.close()
    result = invoke("db", "upgrade", "--store", url)
    assert result.exit_code == 0, result.output
    expected = f"schema upgraded from version {older} to {STORE_SCHEMA}"
    assert result.output.startswith(expected), result.output
    with sqlite3.connect(tmp_path / "state.db") as conn:
        mark = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
    conn.close()
    assert mark == (str(STORE_SCHEMA),)


def test_db_upgrade_says_what_it_did_on_postgres(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signoff.stores.postgres._schema as module
    from signoff.stores.postgres import PostgresStore

    current = module.STORE_SCHEMA
    result = invoke("db", "upgrade", "--store", pg_url)
    assert result.exit_code == 0, result.output
    assert result.output == f"schema created (version {current})\n"
    result = invoke("db", "upgrade", "--store", pg_url)
    assert result.output == f"schema is up to date (version {current})\n"
    # a database another schema (the signoff of migration 2) created, then upgraded
    older = pg_url + "?schema=older"
    monkeypatch.setattr(module, "MIGRATIONS", module.MIGRATIONS[:2])
    monkeypatch.setattr(module, "STORE_SCHEMA", 2)
    assert asyncio.run(PostgresStore(older, migrate=False).migrate()) == (0, 2)
    monkeypatch.undo()
    result = invoke("db", "upgrade", "--store", older)
    assert result.exit_code == 0, result.output
    assert result.output == f"schema upgraded from version 2 to {current}\n"
