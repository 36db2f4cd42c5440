"""The CLI's answering commands at their edges: the documented exit statuses, an expired
request, `/retry` before any turn, the resume command chat prints, approving a question (even one
whose options are `approve` and `cancel`)."""

from __future__ import annotations

import json
import re
import shlex
import time
from typing import Any

import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app
from tests._cli import (
    TARGET,
    invoke,
    log,
    park,
    refunds_run,
    sizer,
    url,
)

__all__ = ["url"]  # the fixture, used by name


def test_exit_statuses_are_the_documented_ones(url: str) -> None:
    """0 done, 1 an error (one line), 2 a command line the parser rejects (README)."""
    park(url)
    assert invoke("pending", "--store", url).exit_code == 0
    assert invoke("events", "ses_nope", "--store", url).exit_code == 1
    for args in (["pending", "--limit", "0"], ["pending", "--nope"], ["approve"], ["nope"]):
        assert invoke(*args, "--store", url).exit_code == 2, args


@so.tool(approval=so.always(expires_in=0.05))
async def refund_soon(order_id: str) -> dict[str, str]:
    """Refund an order, if someone decides soon."""
    return {"refunded": order_id}


hasty = so.Agent(
    name="hasty",
    model=so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="refund_soon", input={"order_id": "1"})]),
            so.ModelResponse(text="Timed out."),
        ]
    ),
    tools=[refund_soon],
)


def test_recording_an_answer_to_an_expired_request_leaves_the_turn_alone(url: str) -> None:
    """`approve` without a runtime, on a request past its deadline, is refused and runs nothing
    (the deadline is applied, as by any reader): it used to drive the turn with its stand-in
    model, failing it with 'no model for agent'."""
    rt = so.Runtime([hasty], store=url)
    try:
        parked = rt.generate_sync("hasty", "refund order 1")
    finally:
        rt.close_sync()
    (request,) = parked.pending
    before = log(url, parked.session_id)
    time.sleep(0.1)
    result = invoke("approve", request.id, "--store", url)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: RequestClosed: "), result.stderr
    after = log(url, parked.session_id)
    assert [e.type for e in after[len(before) :]] == ["input.resolved"], after
    rt = so.Runtime([hasty], store=url)  # a process running the agent continues the turn
    try:
        assert rt.generate_sync(session_id=parked.session_id).text == "Timed out."
    finally:
        rt.close_sync()


def test_chat_retry_before_any_turn_is_not_sent_to_the_model(url: str) -> None:
    """`/retry` with no session yet has nothing to resume: it is not a message to the agent."""
    result = CliRunner().invoke(app, ["chat", "tests._cli:sizer", "--store", url], input="/retry\n")
    assert result.exit_code == 0, result.output
    assert "nothing to retry" in result.output
    assert "session " not in result.output.split("nothing to retry")[1]
    assert json.loads(invoke("sessions", "--store", url, "--json").stdout) == []


def test_the_command_chat_prints_for_a_request_left_pending_runs_as_printed(url: str) -> None:
    """Leaving a prompt with Ctrl-D prints how to answer later; that command carries the store
    and the principal the chat used (and the runtime a response policy needs), so it works."""
    chat = CliRunner().invoke(
        app, ["chat", TARGET, "--store", url, "--as", "web:alice"], input="Refund order 1042\n"
    )
    assert chat.exit_code == 0, chat.output
    later = re.search(r"answer it later with `signoff (approve [^`]+)`", chat.output)
    assert later, chat.output
    approved = invoke(*shlex.split(later.group(1)))
    assert approved.exit_code == 0, approved.output
    assert approved.output.startswith("approved req_"), approved.output
    # and so does the command approve prints to continue the turn, given the runtime
    resume = re.search(r", or signoff (chat MODULE:RUNTIME [^\n]+)", approved.output)
    assert resume, approved.output
    args = [TARGET if a == "MODULE:RUNTIME" else a for a in shlex.split(resume.group(1))]
    resumed = CliRunner().invoke(app, args, input="")
    assert resumed.exit_code == 0, resumed.output
    assert "support: Refunded 180.00." in resumed.output, resumed.output

    gated = CliRunner().invoke(
        app, ["chat", "tests._cli:deployer", "--store", url], input="Deploy prod\n"
    )
    assert gated.exit_code == 0, gated.output
    later = re.search(r"answer it later with `signoff (approve [^`]+)`", gated.output)
    assert later and "tests._cli:deployer" in shlex.split(later.group(1)), gated.output


@pytest.mark.parametrize("command", ["approve", "deny"])
def test_approving_or_denying_a_question_says_to_answer_it(url: str, command: str) -> None:
    """`approve` or `deny` of a question names the command that answers it, not the option
    ('approve', 'cancel') the question lacks; nothing is recorded."""
    rt = so.Runtime([sizer], store=url)
    try:
        question = rt.generate_sync("sizer", "I want coffee").pending[0]
    finally:
        rt.close_sync()
    before = len(log(url, question.session_id))
    result = invoke(command, question.id, "--store", url)
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: InvalidAnswer: {question.id} is a question (Which size?), not an approval: "
        f"signoff answer {question.id} --store {url} --option ID or --text TEXT\n"
    )
    assert len(log(url, question.session_id)) == before


@pytest.mark.parametrize("given", [["--text", "yes"], ["--option", "1"]])
def test_answering_an_approval_with_text_or_an_option_says_to_approve_or_deny_it(
    url: str, given: list[str]
) -> None:
    """`answer` of an approval with text or an option of a question names the commands that
    decide it, where it said `option_id must be 'approve' or 'cancel' (to deny), not None`, in
    the API's terms; nothing is recorded. `--option approve` still approves it."""
    session_id, request_id = park(url)
    before = len(log(url, session_id))
    result = invoke("answer", request_id, *given, "--store", url)
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: InvalidAnswer: {request_id} is an approval (issue_refund), not a question: "
        f"signoff approve {request_id} --store {url} or signoff deny {request_id} --store {url}\n"
    )
    assert len(log(url, session_id)) == before
    approved = invoke("answer", request_id, "--option", "approve", "--store", url)
    assert approved.exit_code == 0, approved.output
    assert f"approved {request_id}" in approved.output


def test_chat_and_approve_run_the_turn_of_a_runtime_left_to_workers(url: str) -> None:
    """`chat` and `approve MODULE:RUNTIME` continue the turn in their own process, as the
    README says, even for a runtime that leaves its turns to workers (`inline=False`): they
    only recorded it and said "another process is running this session's turn" (no process
    was), and chat's next message then failed with `SessionBusy`."""
    target = "tests._cli:offline_runtime"
    chat = CliRunner().invoke(
        app, ["chat", target, "--store", url], input="refund 1042\ny\nthanks\n"
    )
    # The scripted model has no reply to "thanks": that turn fails on its own (no SessionBusy),
    # and chat's exit status says a turn failed.
    assert "the turn failed: ModelError: the Scripted model" in chat.output, chat.output
    assert chat.exit_code == 1, chat.output
    assert "support: Refunded 180.00." in chat.output, chat.output
    assert "another process" not in chat.output and "SessionBusy" not in chat.output
    session_id, request_id = park(url)
    approved = invoke("approve", request_id, target, "--store", url)
    assert approved.exit_code == 0, approved.output
    assert "support: Refunded 180.00." in approved.output, approved.output
    assert "another process" not in approved.output
    assert "turn.completed" in [e.type for e in log(url, session_id)]


def test_recording_again_an_answer_whose_turn_ended_does_not_say_it_continues(
    store_url: str,
) -> None:
    """Approving again a request whose turn has since completed changes nothing and says so.
    Without a runtime it used to add that the turn continues when a worker picks it up (a
    process for a turn that is over); with one, print the turn's last answer as if anew."""
    session_id, request_id = park(store_url)
    assert invoke("approve", request_id, TARGET, "--store", store_url).exit_code == 0
    before = log(store_url, session_id)
    assert "turn.completed" in [e.type for e in before]
    again = invoke("approve", request_id, "--store", store_url)
    assert again.exit_code == 0, again.output
    assert f"{request_id} was already approved; nothing changed." in again.output
    assert "continues when" not in again.output, again.output
    assert "its turn has ended (completed)" in again.output, again.output
    assert len(log(store_url, session_id)) == len(before)  # nothing recorded
    with_runtime = invoke("approve", request_id, TARGET, "--store", store_url)
    assert with_runtime.exit_code == 0, with_runtime.output
    assert f"{request_id} was already approved; nothing changed." in with_runtime.output
    assert "its turn has ended (completed)" in with_runtime.output, with_runtime.output
    assert "support: Refunded" not in with_runtime.output  # no answer anew: nothing ran
    assert len(log(store_url, session_id)) == len(before)


@so.tool
async def choose(ctx: so.ToolContext, takes: str) -> dict[str, object]:
    """Ask one question that takes options, free text or both (`takes`)."""
    options = None if takes == "text" else ["Small", "Large"]
    answer = await ctx.ask("Which size?", options=options, allow_text=takes != "options")
    return {"answer": answer.value}


def _asker(takes: str) -> so.Agent:
    ask = so.ModelResponse(tool_calls=[so.ToolCall(name="choose", input={"takes": takes})])
    model = so.models.Scripted([ask, so.ModelResponse(text="Noted.")])
    return so.Agent(name="asker", model=model, tools=[choose])


ASKERS = {takes: _asker(takes) for takes in ("text", "options", "both")}
asks_text, asks_options, asks_both = ASKERS.values()


@pytest.mark.parametrize(
    ("takes", "flags", "given"),
    [
        ("text", ["--text TEXT"], ["--text", "a big one"]),
        ("options", ["--option ID"], ["--option", "Large"]),
        ("both", ["--option ID", "--text TEXT"], ["--option", "Large"]),
    ],
)
def test_the_answer_chat_says_to_give_later_is_one_the_question_takes(
    url: str, takes: str, flags: list[str], given: list[str]
) -> None:
    """A question left pending in chat is answered later with the options it takes: a free-text
    one was told `--option ID`, which it refuses (it has none), and an options-only one
    `--text TEXT`; so is `approve` of a question told how to answer it."""
    target = f"tests.test_cli_edges:asks_{takes}"
    chat = CliRunner().invoke(app, ["chat", target, "--store", url], input="a coffee\n")
    assert chat.exit_code == 0, chat.output
    later = re.search(r"answer it later with (.+)$", chat.output, re.M)
    assert later, chat.output
    (question,) = json.loads(invoke("pending", "--store", url, "--json").stdout)
    command = f"signoff answer {question['id']} --store {url}"
    assert later.group(1) == "`" + f"{command} " + "` or `".join(flags) + "`", later.group(1)
    refused = invoke("approve", question["id"], "--store", url)
    assert refused.exit_code == 1
    assert refused.stderr.endswith(f"{command} {' or '.join(flags)}\n")  # the same command
    answered = invoke("answer", question["id"], "--store", url, *given)
    assert answered.exit_code == 0, answered.output


def test_an_id_of_the_other_kind_is_named_as_such(url: str) -> None:
    """A session's id given where a request's goes (`approve ses_...`), or a request's where a
    session's goes (`events req_...`, `chat --session req_...`), an easy first mistake, is
    refused saying which it is and what to run; nothing is recorded."""
    session_id, request_id = park(url)
    before = len(log(url, session_id))
    for command in (["approve", session_id], ["deny", session_id]):
        result = invoke(*command, "--store", url)
        assert result.exit_code == 1
        assert result.stderr.endswith(
            f"(that is a session id: `signoff pending --session {session_id}` lists its requests)\n"
        ), result.stderr
    answered = invoke("answer", session_id, "--text", "x", "--store", url)
    assert answered.exit_code == 1 and "that is a session id" in answered.stderr
    for command in (["events", request_id], ["chat", TARGET, "--session", request_id]):
        result = CliRunner().invoke(app, [*command, "--store", url], input="")
        assert result.exit_code == 1
        assert result.stderr == (
            f"error: UnknownSession: unknown session {request_id!r} (that is a request id: "
            "`signoff pending` shows the session of an open one)\n"
        ), result.stderr
    assert len(log(url, session_id)) == before
    # an unknown id of the right kind is refused as before, with no hint
    assert invoke("events", "ses_nope", "--store", url).stderr == (
        "error: UnknownSession: unknown session 'ses_nope'\n"
    )


@so.tool
async def go_ahead(ctx: so.ToolContext) -> dict[str, object]:
    """Ask a question whose options are named as a decision's are."""
    answer = await ctx.ask("Go ahead?", options=["approve", "cancel"], allow_text=False)
    return {"answer": answer.value}


_go = so.ModelResponse(tool_calls=[so.ToolCall(name="go_ahead", input={})])
confirmer = so.Agent(
    name="confirmer",
    model=so.models.Scripted([_go, so.ModelResponse(text="Done.")]),
    tools=[go_ahead],
)


@pytest.mark.parametrize("target", [[], ["tests.test_cli_edges:confirmer"]])
@pytest.mark.parametrize("reason", [[], ["--reason", "too risky"]])
@pytest.mark.parametrize("command", ["approve", "deny"])
def test_approve_or_deny_refuses_a_question_whose_options_are_approve_and_cancel(
    url: str, command: str, reason: list[str], target: list[str]
) -> None:
    """A decision answers approvals only (README, as in Python and over HTTP): `approve` or
    `deny` of a question whose options are `approve` and `cancel` is refused, naming `signoff
    answer`, and nothing is recorded. It used to answer the question (`deny` said "answered
    ... with cancel"), and with `--reason` to fail in the API's terms ("give option_id or text,
    not both": the CLI has no option_id)."""
    rt = so.Runtime([confirmer], store=url)
    try:
        question = rt.generate_sync("confirmer", "go").pending[0]
    finally:
        rt.close_sync()
    before = len(log(url, question.session_id))
    result = invoke(command, question.id, *target, *reason, "--store", url)
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: InvalidAnswer: {question.id} is a question (Go ahead?), not an approval: "
        f"signoff answer {question.id} {shlex.join([*target, '--store', url])} --option ID\n"
    )
    assert len(log(url, question.session_id)) == before
    answered = invoke("answer", question.id, "--option", "cancel", "--store", url)
    assert answered.exit_code == 0, answered.output
    assert f"answered {question.id} with cancel" in answered.output


ALICE_WEB = so.Principal(authenticator="web", principal_id="alice")


def _sizing() -> list[so.Agent]:
    """`sizing`, whose turn asks which size, and `desk`, which delegates to it (the question
    then mirrored in desk's session); each with a script of its own."""
    small, large = ({"label": s, "description": f"{s} cup"} for s in ("Small", "Large"))
    ask = so.ToolCall(
        name="ask_question", input={"question": "Which size?", "options": [small, large]}
    )
    sizing = so.Agent(
        name="sizing",
        model=so.models.Scripted([so.ModelResponse(tool_calls=[ask]), so.ModelResponse(text="ok")]),
        tools=[so.ask_question()],
    )
    delegated = so.ToolCall(name="sizing", input={"message": "which size?"})
    desk = so.Agent(
        name="desk",
        model=so.models.Scripted(
            [so.ModelResponse(tool_calls=[delegated]), so.ModelResponse(text="done")]
        ),
        tools=[so.delegate("sizing")],
    )
    return [sizing, desk]


@pytest.mark.parametrize("agent", ["sizing", "desk"], ids=["own", "mirrored"])
def test_a_decision_on_a_question_is_refused_to_who_may_not_answer_it(url: str, agent: str) -> None:
    """`approve` or `deny` of Alice's question `--as` someone else said it was a question (with
    the command answering it) where their answer to it is refused (`NotAllowed`), as README's
    "Who may answer is checked first" says; so does `answer` of Alice's approval with an option
    a question's. Open or settled, mirrored or not, they are refused as the runtime refuses
    them, told to run as Alice the commands that answer it (not the one typed, which would be
    refused as the wrong kind); Alice is still told the kind while it is open, and that it was
    answered once it was; nothing is recorded. An `answer` of the right kind is hinted with its
    flag, shell-quoted, as Alice can run it (a bare `signoff answer ID` is a usage error, exit
    2); one naming no option of it, with the flags that answer it, each with the store given:
    Alice runs the hint as printed."""
    rt = so.Runtime(_sizing(), store=url)
    try:
        question = rt.generate_sync(agent, "coffee", auth=ALICE_WEB).pending[0]
    finally:
        rt.close_sync()
    as_carol = ("--as", "web:carol", "--store", url)
    on = f"--store {shlex.quote(url)}"
    # The refusal's hint names what answers a question as Alice, not the `approve` typed, which
    # would then be refused as the wrong kind.
    hint = " or ".join(
        f"signoff answer {question.id} {on} {flag} --as web:alice"
        for flag in ("--option ID", "--text TEXT")
    )
    for settled in (False, True):
        before = len(log(url, question.session_id))
        answered = invoke("answer", question.id, "--option", "nope", *as_carol)
        assert answered.exit_code == 1 and "NotAllowed" in answered.stderr, answered.output
        refused, _ = answered.stderr.split(": by default only the asker may answer")
        as_alice = f"{refused}: by default only the asker may answer; as them, run"
        assert answered.stderr == f"{as_alice} {hint}\n", settled
        for command in ("approve", "deny"):
            result = invoke(command, question.id, *as_carol)
            assert result.exit_code == 1, result.output
            assert result.stderr == f"{as_alice} {hint}\n", settled
        hinted = {}
        for typed, flag in (
            (("--option", "1"), "--option 1"),
            (("--text", "a big one"), "--text 'a big one'"),
        ):
            result = invoke("answer", question.id, *typed, *as_carol)
            assert result.exit_code == 1, result.output
            hinted[flag] = f"signoff answer {question.id} {on} {flag} --as web:alice"
            assert result.stderr == f"{as_alice} {hinted[flag]}\n", settled
        told = invoke("approve", question.id, "--as", "web:alice", "--store", url)
        kind = f"InvalidAnswer: {question.id} is a question (Which size?), not an approval"
        if settled:  # not told to run an answer, which would be refused in turn
            kind = f"RequestClosed: request {question.id} was already answered"
        assert told.stderr.startswith(f"error: {kind}"), told.output
        assert len(log(url, question.session_id)) == before
        if not settled:  # Alice runs the hint as it was given
            assert question.options[0].id == "1"
            done = invoke(*shlex.split(hinted["--option 1"])[1:])
            assert done.exit_code == 0, done.output
    session_id, request_id = park(url, auth=ALICE_WEB)
    for given in (["--text", "yes"], ["--option", "1"]):
        refused = invoke("answer", request_id, *given, *as_carol)
        assert refused.exit_code == 1, refused.output
        assert refused.stderr.startswith(f"error: NotAllowed: request {request_id} was asked by")
        assert refused.stderr.endswith(
            f"as them, run signoff approve {request_id} {on} --as web:alice"
            f" or signoff deny {request_id} {on} --as web:alice\n"
        ), refused.stderr
    decided = invoke("answer", request_id, "--option", "approve", *as_carol)
    assert decided.exit_code == 1, decided.output
    assert decided.stderr.endswith(
        f"as them, run signoff answer {request_id} {on} --option approve --as web:alice\n"
    ), decided.stderr
    assert refunds_run(log(url, session_id)) == 0


def _hint(result: Any) -> list[str]:
    """The command a refusal by the default rule says to run as the asker, as a shell reads it
    (after `signoff`)."""
    assert result.exit_code == 1 and "NotAllowed" in result.stderr, result.output
    _, hint = result.stderr.split("; as them, run signoff ")
    return shlex.split(hint)


# What one red line cannot show as typed: its line breaks are joined with spaces, a tab is
# expanded, a control character is shown escaped (`\x1b`), which a shell reads literally.
UNSHOWABLE = (
    "a big one, please:\n  no sugar\n  oat milk",
    "big\r\nplease",
    "big\u2028please",
    "big\tplease",
    "big \x1b[1mplease",
    "big\x85please",
)


def test_a_refused_text_answer_is_hinted_as_typed_or_as_text(url: str) -> None:
    """`answer QUESTION --text ... --as web:carol` hinted Alice the text as the one-line error
    showed it: a multi-line text came out joined with spaces, and run as printed recorded that.
    A text the line shows as typed is hinted shell-quoted, and the hint run as printed records
    it; any other is hinted `--text TEXT`, never another text."""
    rt = so.Runtime(_sizing(), store=url)
    try:
        question = rt.generate_sync("sizing", "coffee", auth=ALICE_WEB).pending[0]
    finally:
        rt.close_sync()
    as_carol = ("--as", "web:carol", "--store", url)
    hinted = ["answer", question.id, "--store", url, "--text", "TEXT", "--as", "web:alice"]
    for typed in UNSHOWABLE:
        hint = _hint(invoke("answer", question.id, "--text", typed, *as_carol))
        assert hint[hint.index("--text") + 1] == "TEXT", typed
        assert hint == hinted
    typed = "it's a [bold]big[/bold] one :coffee: \\"
    hint = _hint(invoke("answer", question.id, "--text", typed, *as_carol))
    assert hint == ["answer", question.id, "--store", url, "--text", typed, "--as", "web:alice"]
    done = invoke(*hint)
    assert done.exit_code == 0, done.output
    (resolved,) = [e for e in log(url, question.session_id) if e.type == "input.resolved"]
    assert resolved.data["answer"]["text"] == typed


@pytest.mark.parametrize("command", ["approve", "deny"])
def test_a_refused_decision_is_hinted_with_its_reason(url: str, command: str) -> None:
    """`deny APPROVAL --reason ... --as web:carol` hinted Alice `signoff deny ID --as
    web:alice`, without the reason typed (which the model reads). The hint keeps `--reason`,
    shell-quoted, or `--reason TEXT` where the line cannot show it as typed; run as printed, it
    records the reason."""
    session_id, request_id = park(url, auth=ALICE_WEB)
    as_carol = ("--as", "web:carol", "--store", url)
    typed = "wrong account, refund order 1043 instead; it's 'urgent'"
    hint = _hint(invoke(command, request_id, "--reason", typed, *as_carol))
    assert "--reason" in hint and hint[hint.index("--reason") + 1] == typed, hint
    assert hint == [command, request_id, "--store", url, "--reason", typed, "--as", "web:alice"]
    for unshowable in UNSHOWABLE:
        given = _hint(invoke(command, request_id, "--reason", unshowable, *as_carol))
        assert given == [*hint[:4], "--reason", "TEXT", "--as", "web:alice"], unshowable
    assert _hint(invoke(command, request_id, *as_carol)) == [*hint[:4], "--as", "web:alice"]
    assert not [e for e in log(url, session_id) if e.type == "input.resolved"]
    done = invoke(*hint)
    assert done.exit_code == 0, done.output
    (resolved,) = [e for e in log(url, session_id) if e.type == "input.resolved"]
    assert resolved.data["reason"] == typed
    assert resolved.data["by"]["principal_id"] == "alice"
