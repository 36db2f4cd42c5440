"""`signoff chat` (`_chat`): resuming a parked session, who may answer, handing a two-person
approval on, retrying a failed turn, each gated call of a step in turn."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pexpect
import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app, local_principal

from ._cli import (
    ROOT,
    TARGET,
    flaky_step,
    invoke,
    log,
    park,
    pg_schemas,
    refunds_run,
    tenant_runtime,
    url,
)

__all__ = ["url"]  # the fixture, used by name


def test_chat_resumes_a_parked_session_and_checks_who_answers(url: str) -> None:
    alice = so.Principal(authenticator="web", principal_id="alice")
    session_id, request_id = park(url, auth=alice)
    args = ["chat", TARGET, "--session", session_id, "--store", url]

    refused = CliRunner().invoke(app, args, input="y\n")
    assert refused.exit_code == 1, refused.output  # the answer refused: chat says so by status
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
        app, ["chat", "tests._cli:treasurer", "--store", url], input="pay ACME\ny\n"
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

    second = invoke("approve", row["id"], "tests._cli:treasurer", "--store", url, "--as", "bob")
    assert second.exit_code == 0, second.output
    assert "treasurer: Wired." in second.output
    assert json.loads(invoke("pending", "--store", url, "--json").stdout) == []


def test_chat_retries_a_failed_turn_without_asking_again(url: str) -> None:
    flaky_step.failed = False
    chat = CliRunner().invoke(
        app, ["chat", "tests._cli:flaky", "--store", url], input="refund 1042\ny\n/retry\n"
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
        ["chat", "tests._cli:double", "--store", url],
        input="refund both\ny\nn\nonly one\n",
    )
    assert chat.exit_code == 0, chat.output
    assert chat.output.count("(y/N)") == 2
    assert 'Run issue_refund({"order_id":"1042"' in chat.output
    assert 'Run issue_refund({"order_id":"1043"' in chat.output
    assert "double: call_1042: refunded; call_1043: denied" in chat.output


def test_chat_asks_a_session_limit_prompt_before_requests_asked_earlier(url: str) -> None:
    """The eve seed: a terminal shows one request at a time "in this order": a runtime-limit
    continuation prompt if one is open, otherwise the request asked first."""
    chat = CliRunner().invoke(
        app,
        ["chat", "tests._cli:limited_runtime", "--agent", "support", "--store", url],
        input="go\n1\ny\n",
    )
    assert chat.exit_code == 0, chat.output
    limit = chat.output.index("Continue with max_tokens raised to")
    approval = chat.output.index("Run issue_refund(")
    assert limit < approval
    assert "support: All done." in chat.output


def test_names_with_brackets_are_printed_as_they_are(url: str) -> None:
    """An agent's name is not Rich markup: `sessions` and `chat` print `ops [eu] [/x]` as it is
    instead of failing with a MarkupError traceback."""
    result = CliRunner().invoke(
        app, ["chat", "tests._cli:bracketed", "--store", url], input="hello\n"
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert "ops [eu] [/x]: done [/] here" in result.output
    listed = invoke("sessions", "--store", url)
    assert listed.exit_code == 0, (listed.output, listed.exception)
    assert "ops [eu] [/x]" in listed.output


def test_an_answer_chat_cannot_take_is_asked_again(url: str) -> None:
    """A reason holding a byte that is not UTF-8 (typed into a pipe, which Python passes on as
    a lone surrogate) is refused as an `InvalidAnswer`, and the approval is asked again: it was
    dropped, left pending, and every message after it failed with `PartialAnswer`."""
    chat = subprocess.run(
        [sys.executable, "-m", "signoff", "chat", TARGET, "--store", url],
        cwd=ROOT,
        input=b"refund 1042\nn\nbro\xe9ken\nn\nbroken\n",
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:surrogateescape"},
        timeout=60,
    )
    output = chat.stdout.decode()
    assert chat.returncode == 0, (output, chat.stderr)
    assert "InvalidAnswer" in output and "PartialAnswer" not in output, output
    assert output.count("(y/N)") == 2, output
    assert "support: Not refunded: broken." in output, output
    assert json.loads(invoke("pending", "--store", url, "--json").stdout) == []


def test_a_yes_holding_a_byte_not_utf8_approves_nothing(url: str) -> None:
    """`y` and a byte that is not UTF-8, piped in (a lone surrogate to Python), approved the
    call: the byte was passed over as a character that draws nothing. The approval is asked
    again, as at any other line it does not take."""
    chat = subprocess.run(
        [sys.executable, "-m", "signoff", "chat", TARGET, "--store", url],
        cwd=ROOT,
        input=b"refund 1042\ny\xff\nn\n\n",
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:surrogateescape"},
        timeout=60,
    )
    output = chat.stdout.decode()
    [session] = json.loads(invoke("sessions", "--store", url, "--json").stdout)
    assert refunds_run(log(url, session["id"])) == 0, output
    assert chat.returncode == 0, (output, chat.stderr)
    assert "answer y or n" in output and output.count("(y/N)") == 2, output


@pytest.mark.parametrize(
    ("typed", "then"),
    [(b"y\xe9\ny\n", "support: Refunded 180.00."), (b"n\nbro\xe9ken\nn\nbroken\n", "broken.")],
)
def test_a_byte_not_utf8_is_asked_again_where_input_is_decoded_strictly(
    url: str, typed: bytes, then: str
) -> None:
    """Under a locale whose standard input Python decodes strictly (en_US.UTF-8, here by
    PYTHONIOENCODING), a byte that is not UTF-8 ended chat with a UnicodeDecodeError traceback,
    every line piped in with it lost. It answers no prompt and is asked again, as in C.UTF-8."""
    chat = subprocess.run(
        [sys.executable, "-m", "signoff", "chat", TARGET, "--store", url],
        cwd=ROOT,
        input=b"refund 1042\n" + typed,
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},
        timeout=60,
    )
    output = chat.stdout.decode()
    assert chat.returncode == 0, (output, chat.stderr)
    assert "Traceback" not in chat.stderr.decode() and output.count("(y/N)") == 2, output
    assert then in output, output
    assert json.loads(invoke("pending", "--store", url, "--json").stdout) == []


def test_a_line_typed_while_the_agent_works_answers_no_prompt(url: str) -> None:
    """`y` and Enter typed at the terminal before the approval was shown (meant for a prompt
    gone by, or typed ahead) approved the call unseen. It is discarded, the person told so, and
    the line typed at the prompt answers it. A pipe's lines are all kept (the tests above)."""
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "200"}
    env.pop("NO_COLOR", None)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "signoff", "chat", TARGET, "--store", url],
        cwd=str(ROOT),
        env=env,
        encoding="utf-8",
        timeout=30,
        dimensions=(50, 200),
    )
    try:
        child.expect_exact("you:")
        child.send("refund 1042\ny\n")  # the `y` waits in the terminal while the model works
        shown = child.expect_exact(["what you typed before this was asked is discarded", "(y/N)"])
        assert shown == 0, child.before
        child.expect_exact("(y/N)")
        child.sendline("n")
        child.expect_exact("Reason")
        child.sendline("not now")
        child.expect_exact("Not refunded: not now.")
        child.expect_exact("you:")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    [session] = json.loads(invoke("sessions", "--store", url, "--json").stdout)
    assert refunds_run(log(url, session["id"])) == 0


def test_chat_names_the_schema_of_its_store_in_the_command_it_prints(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime whose store names its schema as an argument (`PostgresStore(url, schema=)`):
    the `signoff approve ...` printed for a request left pending names that schema, so that run
    as printed it approves the request, rather than look in (and create) the default schema."""

    from signoff.stores.postgres._url import describe

    target = tenant_runtime(tmp_path, monkeypatch, "chat_schema_runtime", pg_url)
    chat = CliRunner().invoke(app, ["chat", target], input="refund 1042\n")
    assert chat.exit_code == 0, chat.output
    assert f"store {describe(pg_url)}?schema=tenant_a\n" in chat.output  # the header too
    printed = re.search(r"`signoff approve ([^`]+)`", chat.output)
    assert printed is not None, chat.output
    approved = invoke("approve", *shlex.split(printed.group(1)))
    assert approved.exit_code == 0, approved.output
    assert approved.stdout.startswith("approved "), approved.output
    schemas = pg_schemas(pg_url)
    assert "tenant_a" in schemas and "signoff" not in schemas, schemas


@pytest.mark.parametrize(
    ("target", "message"),
    [("tests._cli:sizer", "I want coffee"), (TARGET, "Refund order 1042")],
    ids=["question", "approval"],
)
@pytest.mark.parametrize("typed", ["/exit", "/quit"])
def test_exit_at_a_prompt_leaves_the_request_pending(
    url: str, target: str, message: str, typed: str
) -> None:
    """`/exit` or `/quit` typed at a question's or an approval's prompt leaves chat with the
    request pending, as Ctrl-D does and `/help` says: a question that takes free text took it
    as the answer and the turn went on with it, and an approval said to answer y or n."""
    chat = CliRunner().invoke(app, ["chat", target, "--store", url], input=f"{message}\n{typed}\n")
    assert chat.exit_code == 0, chat.output
    assert "answer y or n" not in chat.output, chat.output
    [request] = json.loads(invoke("pending", "--store", url, "--json").stdout)
    assert f"left {request['id']} pending" in chat.output, chat.output
    events = log(url, request["session_id"])
    assert [e.type for e in events][-1] == "turn.waiting"
    assert not [e for e in events if e.type == "input.resolved"]


@pytest.mark.parametrize("blip", [False, True], ids=["retry", "retry-after-a-blip"])
def test_chat_names_its_session_before_a_first_turn_a_store_failure_cuts_short(
    url: str, monkeypatch: pytest.MonkeyPatch, blip: bool
) -> None:
    """chat learned its session's id only when the first turn returned: a store failure (or a
    Ctrl-C) cutting that turn short left the id unsaid, `/retry` found nothing to resume, and
    the next message opened a second session beside the stranded one. A store failure under
    `/retry` itself ended chat with status 1 instead of a line it goes on after."""
    from rich.console import Console

    from signoff.channels import TerminalChannel
    from signoff.cli._chat import _Chat

    from ._cli import agent

    typed = iter(["refund order 1042", "y", *(["/retry"] if blip else []), "/retry", "/exit"])
    console = Console(file=io.StringIO(), width=200)

    async def go() -> None:
        async with so.Runtime([agent], store=url) as rt:
            commit, state = rt.store.commit, rt.state
            failures = {"commit": 1, "state": int(blip)}

            async def failing_commit(c: Any) -> Any:
                if failures["commit"] and "tool.completed" in [e.type for e in c.events]:
                    failures["commit"] -= 1
                    raise so.StoreUnavailable("the database went away (test)")
                return await commit(c)

            async def failing_state(session_id: str, **kw: Any) -> Any:
                if failures["state"]:
                    failures["state"] -= 1
                    raise so.StoreUnavailable("the database is restarting (test)")
                return await state(session_id, **kw)

            monkeypatch.setattr(rt.store, "commit", failing_commit)
            monkeypatch.setattr(rt, "state", failing_state)
            chat = _Chat(rt, agent, console, local_principal(), target=TARGET)
            chat.channel = TerminalChannel(console, read=lambda prompt: next(typed))
            await chat.run(None)
            assert not chat.undone

    asyncio.run(go())
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    rt = so.Runtime([], store=url)
    try:
        (session,) = rt.sessions_sync()
    finally:
        rt.close_sync()
    assert shown.index(f"session {session.id}") < shown.index("the database went away (test)")
    assert session.status == "idle" and "support: Refunded 180.00." in shown
    assert ("the database is restarting (test)" in shown) == blip


def test_a_first_message_chat_refuses_leaves_no_session(url: str) -> None:
    """chat opens its session before the first turn; a first message the runtime refuses (a
    lone surrogate, one over the size limit) then left an empty session behind."""
    from rich.console import Console

    from signoff._answers import MAX_TEXT_BYTES
    from signoff.channels import TerminalChannel
    from signoff.cli._chat import _Chat

    from ._cli import agent

    typed = iter(["x" * (MAX_TEXT_BYTES + 1), "bad \ud800", "/exit"])
    console = Console(file=io.StringIO(), width=200)

    async def go() -> bool:
        async with so.Runtime([agent], store=url) as rt:
            chat = _Chat(rt, agent, console, local_principal(), target=TARGET)
            chat.channel = TerminalChannel(console, read=lambda prompt: next(typed))
            await chat.run(None)
            assert await rt.sessions() == []
            return chat.undone

    assert asyncio.run(go())
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert "TooLarge" in shown and "lone surrogate" in shown and "session ses_" not in shown
