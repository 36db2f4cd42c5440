"""`signoff pending / sessions / approve / deny / answer / events` (`_queue`) against a SQLite
store holding a parked session: recording only, or continuing the turn here."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shlex
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from psycopg import conninfo
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app, local_principal
from signoff.testing import call, call_tools, reply, scripted_agent, tool_results

from ._cli import (
    TARGET,
    agent,
    deployer,
    double,
    invoke,
    log,
    park,
    park_flaky,
    pg_schemas,
    refunds_run,
    refused_usage,
    sizer,
    tenant_runtime,
    url,
)
from ._procs import query

__all__ = ["url"]  # the fixture, used by name


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


def test_pending_says_where_a_cut_input_is_whole(url: str) -> None:
    """The table cuts a request's input at 200 characters with "...": it now says, under the
    table, that `--json` shows it whole; a table with nothing cut says nothing of it."""
    from ._cli import issue_refund

    reason = "the parcel arrived crushed " * 20
    long_agent = scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="1042", amount=180.0, reason=reason))],
        tools=[issue_refund],
    )
    with so.Runtime([long_agent], store=url) as rt:
        assert rt.generate_sync("support", "Refund order 1042").status == "waiting"
    result = invoke("pending", "--store", url)
    assert result.exit_code == 0, result.output
    assert "..." in result.output
    assert "cut at 200 characters: --json shows them whole." in " ".join(result.output.split())
    as_json = json.loads(invoke("pending", "--store", url, "--json").stdout)
    assert as_json[0]["action"]["input"]["reason"] == reason


def test_a_table_with_nothing_cut_says_nothing_of_json(url: str) -> None:
    park(url)
    result = invoke("pending", "--store", url)
    assert result.exit_code == 0, result.output
    assert "--json" not in result.output


def test_pending_says_how_many_more_a_limit_left_out(url: str) -> None:
    """`--limit` shows the oldest requests and says how many are open in all."""
    ids = [park(url)[1] for _ in range(3)]
    result = invoke("pending", "--store", url, "--limit", "2")
    assert result.exit_code == 0, result.output
    assert "Pending requests (2 of 3)" in result.output
    assert ids[0] in result.output and ids[2] not in result.output
    result = invoke("pending", "--store", url, "--limit", "3")
    assert "Pending requests (3)" in result.output


def test_pending_filters_and_empty_queue(url: str) -> None:
    park(url)
    for args in (["--tool", "lookup_order"], ["--agent", "billing"]):
        result = invoke("pending", "--store", url, *args)
        assert result.exit_code == 0
        assert "No pending requests." in result.output
    result = invoke("pending", "--store", url, "--tool", "issue_refund", "--json")
    assert len(json.loads(result.stdout)) == 1


def test_pending_of_a_session_that_does_not_exist_says_so(url: str) -> None:
    """A mistyped `--session` is an error naming it, not "No pending requests." (a session
    with none open still lists none); a request id given there says which it is."""
    session_id, request_id = park(url)
    for args in (["--session", "ses_mistyped"], ["--session", "ses_mistyped", "--json"]):
        result = invoke("pending", "--store", url, *args)
        assert result.exit_code == 1, result.output
        assert "UnknownSession" in result.output and "ses_mistyped" in result.output
        assert "No pending requests." not in result.output
    result = invoke("pending", "--store", url, "--session", request_id)
    assert result.exit_code == 1 and "that is a request id" in result.output
    result = invoke("approve", request_id, "--store", url)
    assert result.exit_code == 0, result.output
    result = invoke("pending", "--store", url, "--session", session_id)
    assert result.exit_code == 0 and "No pending requests." in result.output


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

    picked = invoke("answer", question.id, "tests._cli:sizer", "--store", url, "--option", "2")
    assert picked.exit_code == 0, picked.output
    assert f"answered {question.id} with 2" in picked.output
    assert "sizer: You chose Large." in picked.output

    typed = invoke(
        "answer", second.pending[0].id, "tests._cli:sizer", "--store", url, "--text", "both"
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
    # answered above: said so, not named the `answer` that would be refused in turn
    assert approve_question.stderr == (
        f"error: RequestClosed: request {second.pending[0].id} was already answered; "
        "it takes no answers\n"
    )
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


def test_sessions_refuses_an_unknown_status(url: str) -> None:
    park(url)
    result = invoke("sessions", "--store", url, "--status", "waitin")
    assert refused_usage(result).startswith("Invalid value: --status takes one of idle, running, ")
    waiting = invoke("sessions", "--store", url, "--status", "waiting", "--json")
    assert [r["status"] for r in json.loads(waiting.stdout)] == ["waiting"]


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
        "approve", request.id, "tests._cli:deployer", "--store", url, "--as", "web:alice"
    )
    assert refused.exit_code == 1, refused.output
    assert "not accepted (rejected)" in refused.stderr
    assert "already" not in refused.output
    assert [r["id"] for r in json.loads(invoke("pending", "--store", url, "--json").stdout)] == [
        request.id
    ]
    allowed = invoke(
        "approve", request.id, "tests._cli:deployer", "--store", url, "--as", "web:bob"
    )
    assert allowed.exit_code == 0, allowed.output
    assert "deployer: Deployed." in allowed.output
    # Once it closed, the asker is refused alike: told neither that it stays pending nor how
    # it was settled, and nothing is recorded.
    settled = len(log(url, parked.session_id))
    late = invoke("approve", request.id, "tests._cli:deployer", "--store", url, "--as", "web:alice")
    assert late.exit_code == 1, late.output
    assert "not accepted (rejected)" in late.stderr
    assert "pending" not in late.output and "already" not in late.output
    assert len(log(url, parked.session_id)) == settled


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


@pytest.mark.parametrize("target", [[], ["tests._cli:sizer"]])
def test_a_wrong_kind_refusal_names_the_command_to_run_as_printed(
    url: str, target: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`approve` of a question named `signoff answer REQ --option ID or --text TEXT` without the
    `MODULE:RUNTIME`, `--store` and `--as` typed: run as printed (elsewhere, no SIGNOFF_STORE),
    it opened the default store ("no store at .signoff/state.db"), or answered as another.
    The hint keeps them, as the `NotAllowed` one does, and answers the question as printed."""
    alice = so.Principal(authenticator="web", principal_id="alice")
    rt = so.Runtime([sizer], store=url)
    try:
        question = rt.generate_sync("sizer", "I want coffee", auth=alice).pending[0]
    finally:
        rt.close_sync()
    monkeypatch.delenv("SIGNOFF_STORE", raising=False)
    monkeypatch.chdir(tmp_path)  # no default store here
    where = [*target, "--store", url, "--as", "web:alice"]
    told = invoke("approve", question.id, *where)
    assert told.exit_code == 1, told.output
    hint = told.stderr.split("not an approval: ", 1)[1].rstrip("\n")
    rid = shlex.join([question.id, *where])
    assert hint == f"signoff answer {rid} --option ID or --text TEXT", told.stderr
    printed = shlex.split(hint.split(" or ")[0].replace("--option ID", "--option 1"))
    answered = invoke(*printed[1:])
    assert answered.exit_code == 0, answered.output
    assert f"answered {question.id} with 1" in answered.output
    settled = next(e for e in log(url, question.session_id) if e.type == "input.resolved")
    assert settled.data["by"]["principal_id"] == "alice", settled.data


@pytest.mark.parametrize("given", [" ", "web: ", "\t:alice"])
def test_as_naming_no_one_is_refused_before_anything_runs(
    given: str, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--as " "` (or SIGNOFF_PRINCIPAL set to blanks): `chat` made its store and then refused
    every message typed, one by one, and exited 1; `approve` looked the request up before the
    runtime refused the answer. It is a command line of the wrong form, as `--as :nobody` is:
    usage, exit 2, nothing made or recorded."""
    session_id, request_id = park(url)
    before = log(url, session_id)
    refused = invoke("approve", request_id, "--store", url, "--as", given)
    assert refused_usage(refused).startswith(f"Invalid value: --as {given!r} names no one: its ")
    assert log(url, session_id) == before
    fresh = tmp_path / "fresh.db"
    monkeypatch.setenv("SIGNOFF_PRINCIPAL", given)
    chat = CliRunner().invoke(app, ["chat", TARGET, "--store", f"sqlite:///{fresh}"], input="hi\n")
    assert refused_usage(chat).startswith(f"Invalid value: --as {given!r} names no one: its ")
    assert not fresh.exists()


@pytest.mark.parametrize("given", ["alice ", " alice", "local :alice", "local: alice"])
def test_as_with_spaces_around_a_name_is_refused(given: str, url: str) -> None:
    """`--as "alice "` was another principal than `alice` (a second vote in a quorum), though
    every refusal printed the two alike: usage, exit 2, nothing recorded."""
    session_id, request_id = park(url)
    before = log(url, session_id)
    refused = invoke("approve", request_id, "--store", url, "--as", given)
    assert refused_usage(refused) == f"Invalid value: --as {given!r} has spaces around a name: " + (
        "write it without them"
    )
    assert log(url, session_id) == before


def test_approve_whose_turn_another_process_cancels_meanwhile_says_so(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn this command went on to run was cancelled from elsewhere while the model ran:
    it printed only "approved", as if the turn went on."""
    session_id, request_id = park(url)
    complete = so.models.Scripted.complete

    async def cancelled_meanwhile(self: so.models.Scripted, request: Any) -> so.ModelResponse:
        elsewhere = so.Runtime([agent], store=url, inline=False)
        try:
            await elsewhere.cancel(request.session_id, "stop it")
        finally:
            await elsewhere.close()
        return await complete(self, request)

    monkeypatch.setattr(so.models.Scripted, "complete", cancelled_meanwhile)
    result = invoke("approve", request_id, TARGET, "--store", url)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-2:] == [
        f"approved {request_id} (issue_refund in session {session_id})",
        "the turn was cancelled",
    ]
    cancels = [e for e in log(url, session_id) if e.type == "turn.cancelled"]
    assert [e.data.get("reason") for e in cancels] == ["stop it"]


def test_approve_that_continues_a_turn_which_then_fails_exits_1(url: str) -> None:
    """The answer is recorded, but the turn this command went on to run failed: a script must
    not read that as success (it exited 0, the failure a line on stdout among the others)."""
    parked = park_flaky(url)
    request_id = parked.pending[0].id
    result = invoke("approve", request_id, "tests._cli:flaky", "--store", url)
    assert result.exit_code == 1, result.output
    assert f"approved {request_id}" in result.stdout
    assert result.stderr == (
        "error: the turn failed: ModelError: upstream timed out; it resumes with signoff chat "
        f"tests._cli:flaky --session {parked.session_id} --store {url}\n"
    )
    assert json.loads(invoke("pending", "--store", url, "--json").stdout) == []
    assert refunds_run(log(url, parked.session_id)) == 1


def test_a_failed_turns_resume_command_names_the_schema_of_the_runtimes_store(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime whose store names its schema as an argument (`PostgresStore(url, schema=)`):
    the `signoff chat ...` printed to resume the failed turn names that schema, so that run as
    printed it resumes the session, rather than look in (and create) the default schema."""

    target = tenant_runtime(tmp_path, monkeypatch, "queue_schema_runtime", pg_url, agent="flaky")
    parked = park_flaky(f"{pg_url}?schema=tenant_a")
    result = invoke("approve", parked.pending[0].id, target)
    assert result.exit_code == 1, result.output
    said = result.stderr.split("; it resumes with signoff ")
    assert len(said) == 2, result.output
    resumed = CliRunner().invoke(app, shlex.split(said[1]), input="")
    assert resumed.exit_code == 0, resumed.output
    assert "flaky: Refunded 180.00." in resumed.output
    schemas = pg_schemas(pg_url)
    assert "tenant_a" in schemas and "signoff" not in schemas, schemas


def test_pending_shows_the_asker_as_as_takes_it(url: str) -> None:
    """An operator answering from the command line a request asked over the API copies who
    asked into `--as`: the queue shows `token:ops`, not `ops` (which `--as` reads as
    `local:ops`, refused), and the refusal of another principal names it the same way."""
    ops = so.Principal(authenticator="token", principal_id="ops")
    _, request_id = park(url, auth=ops)
    shown = invoke("pending", "--store", url)
    assert shown.exit_code == 0, shown.output
    assert "token:ops" in shown.output
    refused = invoke("approve", request_id, "--store", url, "--as", "local:root")
    assert refused.exit_code == 1
    assert "was asked by token:ops; local:root may not settle it" in refused.stderr
    # and says what to run instead
    assert refused.stderr.endswith(
        "by default only the asker may answer; as them, run signoff approve "
        f"{request_id} --store {shlex.quote(url)} --as token:ops\n"
    )
    done = invoke("approve", request_id, "--store", url, "--as", "token:ops")
    assert done.exit_code == 0, done.output


def test_a_refusal_names_no_as_where_the_asker_alone_could_not_answer(url: str) -> None:
    """The `--as` hint is for the default rule only: a request no one may answer as its asker
    (a quorum that excludes the requester) is refused without it."""
    ops = so.Principal(authenticator="token", principal_id="ops")
    _, request_id = park(url, auth=ops)
    refused = invoke("deny", request_id, "--store", url)
    assert refused.exit_code == 1
    assert f"signoff deny {request_id} --store {shlex.quote(url)} --as token:ops" in refused.stderr

    @so.tool(approval=so.always(approvers=2, exclude_requester=True))
    async def wire(amount: float) -> float:
        """Wire money."""
        return amount

    wirer = scripted_agent("wirer", [call_tools(call("wire", amount=5))], tools=[wire])
    rt = so.Runtime([wirer], store=url)
    try:
        parked = rt.generate_sync("wirer", "Wire 5", auth=ops)
    finally:
        rt.close_sync()
    (request,) = parked.pending
    assert request.exclude_requester
    other = invoke("approve", request.id, "--store", url, "--as", "token:ops")
    assert other.exit_code == 1
    assert "NotAllowed" in other.stderr and "--as" not in other.stderr


def lapsed_pair(url: str) -> tuple[str, str]:
    """Two sessions whose TTL passed with their turn running: one a live drive holds elsewhere
    (a worker whose tool outruns the TTL: its lease has long to run), one no drive holds."""
    ttl_agent = scripted_agent("a", [reply("Done.")], limits=so.Limits(ttl=60))
    rt = so.Runtime([ttl_agent], store=url, clock=lambda: 1000.0, inline=False)
    try:
        held, free = (rt.generate_sync("a", prompt="hello").session_id for _ in range(2))
    finally:
        rt.close_sync()

    async def lease() -> None:
        store = so.stores.open_store(url)
        try:
            assert await store.acquire_lease(held, "elsewhere", 600, time.time()) is not None
        finally:
            await store.close()

    asyncio.run(lease())
    return held, free


def leases(url: str) -> list[tuple[Any, ...]]:
    return sorted(query(url, "SELECT sk, owner, token, expires_at FROM {t}leases"))


def test_sessions_reads_which_drives_hold_a_lease_and_writes_nothing(store_url: str) -> None:
    """`signoff sessions` lists a session whose TTL passed while a live drive runs its turn as
    the store holds it (running), and one no drive holds as its expiry leaves it (failed). It
    reads the leases to tell them apart: it used to ask for each one's lease and give it back,
    a write (the free one's lease row was created) from a command that only reads."""
    held, free = lapsed_pair(store_url)
    before = leases(store_url)
    result = invoke("sessions", "--store", store_url, "--json")
    assert result.exit_code == 0, result.output
    assert {r["id"]: r["status"] for r in json.loads(result.stdout)} == {
        held: "running",
        free: "failed",
    }
    assert leases(store_url) == before


def test_sessions_lists_leases_as_a_postgres_role_that_may_only_select(
    pg_store_url: str,
) -> None:
    """A role granted only SELECT (a dashboard's, an auditor's) lists the sessions: the session
    a live drive holds is running, as it is. Its lease probe, a write, was refused, and the
    session was listed failed."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    held, free = lapsed_pair(pg_store_url)
    role = f"reader_{uuid.uuid4().hex[:8]}"
    params = conninfo_to_dict(pg_store_url)
    reader = f"postgresql://{role}@{params['host']}:{params['port']}/{params['dbname']}"
    with psycopg.connect(pg_store_url, autocommit=True) as conn:
        conn.execute(
            f'CREATE ROLE "{role}" LOGIN; GRANT USAGE ON SCHEMA signoff TO "{role}"; '
            f'GRANT SELECT ON ALL TABLES IN SCHEMA signoff TO "{role}"'.encode()
        )
    try:
        result = invoke("sessions", "--store", reader, "--json")
        assert result.exit_code == 0, result.output
        assert {r["id"]: r["status"] for r in json.loads(result.stdout)} == {
            held: "running",
            free: "failed",
        }
    finally:
        with psycopg.connect(pg_store_url, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"; DROP ROLE "{role}"'.encode())


@pytest.mark.parametrize("from_env", [False, True])
def test_a_resume_hint_opens_the_store_with_its_password(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, from_env: bool
) -> None:
    """The command printed to resume a failed turn named the store as logs do, without its
    password: run as printed against a server that asks for one, it could not connect. A store
    `SIGNOFF_STORE` names is left to it (the password with it); another shows `***` to fill."""
    params = conninfo.conninfo_to_dict(pg_url)  # the test cluster trusts loopback: any
    url = f"postgresql://{params['user']}:hunter2@{params['host']}:{params['port']}/"  # password
    url += str(params["dbname"])
    parked = park_flaky(url)
    if from_env:
        monkeypatch.setenv("SIGNOFF_STORE", url)
        result = invoke("approve", parked.pending[0].id, "tests._cli:flaky")
    else:
        result = invoke("approve", parked.pending[0].id, "tests._cli:flaky", "--store", url)
    assert result.exit_code == 1, result.output
    hint = f"; it resumes with signoff chat tests._cli:flaky --session {parked.session_id}"
    if from_env:
        assert result.stderr.endswith(f"{hint}\n"), result.stderr
    else:
        masked = url.replace(":hunter2@", ":***@")
        assert result.stderr.endswith(f"{hint} --store '{masked}'\n"), result.stderr
    assert "hunter2" not in result.output


def test_a_hint_masks_all_of_a_password_libpq_reads_from_the_query() -> None:
    """libpq reads `?password=` up to the next `&`, a `#` included: the hint's mask stopped at
    the `#` and printed the rest of the password."""
    from signoff.cli._app import store_args

    url = "postgresql://app@db/prod?password=hunter2#42&sslmode=require"
    assert store_args(url) == ["--store", "postgresql://app@db/prod?password=***&sslmode=require"]
    assert store_args("postgresql://app:pw#1@db/prod") == [
        "--store",
        "postgresql://app:***@db/prod",
    ]
