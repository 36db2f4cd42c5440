"""`signoff chat`'s exit status, for a script that feeds it from a pipe: 1 when something it
was given was not carried out (a turn failed and not resumed, a message or an answer refused),
0 otherwise; and a session it cannot continue is refused before anything else is printed."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from signoff.cli import app

from ._cli import TARGET, flaky_step, invoke, log, park, url

__all__ = ["url"]  # the fixture, used by name

TOO_LONG = "x" * ((4 << 20) + 1)  # over an answer's or a prompt's MAX_TEXT_BYTES


def test_chat_exits_1_when_the_last_turn_failed_and_was_not_resumed(url: str) -> None:
    flaky_step.failed = False
    chat = CliRunner().invoke(
        app, ["chat", "tests._cli:flaky", "--store", url], input="refund 1042\ny\n"
    )
    assert "the turn failed: ModelError: upstream timed out" in chat.output, chat.output
    assert chat.exit_code == 1, chat.output


def test_chat_exits_1_when_a_message_was_refused(url: str) -> None:
    """Even when a later one is answered: what the refused one said was never carried out."""
    chat = CliRunner().invoke(
        app, ["chat", TARGET, "--store", url], input=f"{TOO_LONG}\nrefund 1042\ny\n"
    )
    assert "TooLarge: the prompt is " in chat.output
    assert "support: Refunded 180.00." in chat.output
    assert chat.exit_code == 1, chat.output[-500:]


def test_chat_exits_1_when_an_answer_was_refused_and_never_given(url: str) -> None:
    """A denial's reason over the limit is refused and asked again; the pipe ends there."""
    chat = CliRunner().invoke(
        app, ["chat", TARGET, "--store", url], input=f"refund 1042\nn\n{TOO_LONG}\n"
    )
    assert "over the limit" in chat.output
    assert chat.output.count("(y/N)") == 2
    assert chat.exit_code == 1, chat.output[-500:]
    assert len(json.loads(invoke("pending", "--store", url, "--json").stdout)) == 1


def test_chat_exits_0_when_an_answer_refused_is_then_given(url: str) -> None:
    chat = CliRunner().invoke(
        app,
        ["chat", TARGET, "--store", url],
        input=f"refund 1042\nn\n{TOO_LONG}\nn\nbroken\n",
    )
    assert "support: Not refunded: broken." in chat.output
    assert chat.exit_code == 0, chat.output[-500:]


def test_chat_exits_0_when_it_leaves_a_request_pending(url: str) -> None:
    """Leaving an approval for later (the pipe ends at its prompt) is no error."""
    chat = CliRunner().invoke(app, ["chat", TARGET, "--store", url], input="refund 1042\n")
    assert "left " in chat.output and " pending" in chat.output
    assert chat.exit_code == 0, chat.output


@pytest.mark.parametrize("then", ["/exit\n", "/quit\n", ""], ids=["exit", "quit", "end"])
def test_leaving_at_a_denials_reason_prompt_leaves_the_request_pending(url: str, then: str) -> None:
    """`/exit` (or the input's end) typed at the "Reason (optional)" prompt after `n` denied
    the call with no reason, and chat went on as if nothing were left: `/exit` and Ctrl-D leave
    a request pending at its other prompts, as `/help` says. The denial is not sent: the
    request stays pending, chat says how to answer it later, and nothing else is recorded."""
    chat = CliRunner().invoke(
        app, ["chat", TARGET, "--store", url], input=f"refund 1042\nn\n{then}"
    )
    assert chat.exit_code == 0, chat.output
    assert "Reason (optional):" in chat.output
    assert "left req_" in chat.output and " pending" in chat.output, chat.output
    assert "denied" not in chat.output
    (pending,) = json.loads(invoke("pending", "--store", url, "--json").stdout)
    assert [e.type for e in log(url, pending["session_id"])][-1] == "turn.waiting"


def test_chat_of_an_unknown_session_says_so_alone_before_any_header(url: str) -> None:
    park(url)  # the store exists, the session does not
    chat = CliRunner().invoke(
        app, ["chat", TARGET, "--store", url, "--session", "ses_nope"], input="hi\n"
    )
    assert chat.exit_code == 1, chat.output
    assert chat.stdout == "", chat.stdout
    assert chat.stderr == "error: UnknownSession: unknown session 'ses_nope'\n", chat.stderr
