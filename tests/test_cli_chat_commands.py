"""`signoff chat`'s own commands: `/help` and `/retry` when there is nothing to retry are
answered by chat itself, never sent to the agent or shown as a new answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app

greeter = so.Agent(
    name="greeter",
    model=so.models.Scripted(
        [lambda conversation: so.ModelResponse(text=f"hello after {len(conversation)}")] * 4
    ),
)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


def chat(url: str, typed: str) -> str:
    result = CliRunner().invoke(
        app, ["chat", "tests.test_cli_chat_commands:greeter", "--store", url], input=typed
    )
    assert result.exit_code == 0, result.output
    return result.output


def sessions(url: str) -> list[dict[str, object]]:
    listing = CliRunner().invoke(app, ["sessions", "--store", url, "--json"])
    assert listing.exit_code == 0, listing.output
    found: list[dict[str, object]] = json.loads(listing.stdout)
    return found


def test_help_lists_the_commands_and_sends_nothing(url: str) -> None:
    output = chat(url, "/help\n")
    assert "/help for more" in output  # the banner says it exists
    assert "/retry resumes a turn whose model call failed" in output
    assert "/exit, /quit or Ctrl-D leaves" in output
    assert "session " not in output and "hello" not in output
    assert sessions(url) == []


def test_retry_after_a_completed_turn_says_so_instead_of_answering_again(url: str) -> None:
    """Resuming a turn that completed would print its last answer again, as if the agent had
    answered anew; chat says there is nothing to retry, and the model is not called."""
    output = chat(url, "hi\n/retry\n")
    assert output.count("greeter: hello after 1") == 1
    assert "nothing to retry: the last turn completed" in output
    [session] = sessions(url)
    rt = so.Runtime([greeter], store=url)
    try:
        events = rt.events_sync(str(session["id"]))
    finally:
        rt.close_sync()
    assert [e.type for e in events].count("model.completed") == 1


echo = so.Agent(name="echo", model=so.models.Scripted([so.ModelResponse(text="echoed")]))
both = so.Runtime([greeter, echo], store="sqlite:///unused.db")  # --store replaces it
lacking = so.Runtime(
    [so.Agent(name=n, model=so.models.Scripted([])) for n in ("a", "b")],
    store="sqlite:///unused.db",
)


def test_a_session_of_another_agent_says_how_to_continue_it(url: str) -> None:
    """`--session` of another agent's session names that agent, and either the `--agent` that
    picks it or the agents this runtime has, when it lacks it; a runtime of several agents
    needs no `--agent` to continue a session, whose agent it reads."""
    sid = so.Runtime([echo], store=url).generate_sync("echo", "hi").session_id
    for args, how in (
        (["tests.test_cli_chat_commands:both", "--agent", "greeter"], "pass --agent echo"),
        (
            ["tests.test_cli_chat_commands:greeter"],
            "which this runtime does not have (it has: greeter)",
        ),
        (
            ["tests.test_cli_chat_commands:lacking"],
            "which this runtime does not have (it has: a, b)",
        ),
    ):
        result = CliRunner().invoke(app, ["chat", *args, "--store", url, "--session", sid])
        assert result.exit_code == 1, result.output
        assert result.stderr == (
            f"error: UsageError: session '{sid}' belongs to agent 'echo': {how}\n"
        ), result.stderr
        assert result.stdout == "", result.stdout  # the error alone: no header before it
    resumed = CliRunner().invoke(
        app, ["chat", "tests.test_cli_chat_commands:both", "--store", url, "--session", sid]
    )
    assert resumed.exit_code == 0, resumed.output
    assert "agent echo" in resumed.output and f"session {sid} (resumed)" in resumed.output
    several = CliRunner().invoke(app, ["chat", "tests.test_cli_chat_commands:both", "--store", url])
    assert several.exit_code == 1
    assert "several agents (greeter, echo): choose one with --agent" in several.stderr


empty = so.Runtime([], store="sqlite:///unused.db")


def test_chat_with_a_runtime_of_no_agents_says_so(url: str) -> None:
    """A runtime with no agents was said to have several, "(none)", and to need `--agent`,
    which could only fail."""
    result = CliRunner().invoke(app, ["chat", "tests.test_cli_chat_commands:empty", "--store", url])
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        "error: UsageError: tests.test_cli_chat_commands:empty has no agents to chat with\n"
    ), result.stderr
