"""The real `signoff` command in a pseudo-terminal (pexpect), and `TerminalChannel` on its own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from rich.console import Console
from typer.testing import CliRunner

import signoff as so
from signoff.channels import TerminalChannel, compact_json
from signoff.cli import app

from .fakes.llm import API_KEY, FakeLLM, openai_completion, openai_tool_call

ROOT = Path(__file__).resolve().parents[1]
# the console script installed beside the interpreter running the tests (any venv, any checkout)
SIGNOFF = str(Path(sys.executable).with_name("signoff"))
TIMEOUT = 30
REFUND_PROMPT = re.escape(
    'Run issue_refund({"order_id":"1042","amount":180,"reason":"It arrived broken"})?'
)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/s.db"


PROVIDER_VARIABLES = ("SIGNOFF_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY")


def spawn(*args: str, **extra_env: str) -> pexpect.spawn[str]:
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="160", LINES="50")
    for name in ("NO_COLOR", *PROVIDER_VARIABLES):
        env.pop(name, None)  # the example's offline demo model, whatever this machine has set
    env.update(extra_env)
    child = pexpect.spawn(
        SIGNOFF,
        list(args),
        cwd=str(ROOT),
        env=env,
        encoding="utf-8",
        timeout=TIMEOUT,
        dimensions=(50, 160),
    )
    return child


@pytest.fixture
def children() -> Iterator[list[pexpect.spawn[str]]]:
    spawned: list[pexpect.spawn[str]] = []
    yield spawned
    for child in spawned:
        if child.isalive():
            child.terminate(force=True)
        child.close()


def chat(url: str, children: list[pexpect.spawn[str]], *extra: str) -> pexpect.spawn[str]:
    child = spawn("chat", "examples.support:runtime", "--store", url, *extra)
    children.append(child)
    child.expect_exact("demo model:")
    if not extra:
        child.expect_exact("you:")
    return child


def group(child: pexpect.spawn[str]) -> str:
    assert isinstance(child.match, re.Match)
    found = child.match.group(1)
    assert isinstance(found, str)
    return found


def finish(child: pexpect.spawn[str]) -> None:
    child.expect_exact("you:")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def log(url: str, session_id: str) -> list[so.Event]:
    rt = so.Runtime([], store=url)
    try:
        return rt.events_sync(session_id)
    finally:
        rt.close_sync()


def ask_refund(child: pexpect.spawn[str]) -> str:
    """Type the refund request; return the session id the chat prints."""
    child.sendline("refund order 1042, it arrived broken")
    child.expect(r"session (ses_\w+)")
    session_id = group(child)
    child.expect(REFUND_PROMPT)
    return session_id


def refund_results(events: list[so.Event]) -> list[str]:
    return [
        e.data["status"]
        for e in events
        if e.type == "tool.completed" and e.data["tool_name"] == "issue_refund"
    ]


def test_chat_prompts_inline_and_runs_the_approved_refund(
    url: str, children: list[pexpect.spawn[str]]
) -> None:
    child = chat(url, children)
    session_id = ask_refund(child)
    child.expect_exact("(y/N)")
    child.sendline("y")
    child.expect_exact("support:")
    child.expect_exact("Done. I've refunded 180.00 for order 1042 to the original payment method.")
    finish(child)

    events = log(url, session_id)
    assert refund_results(events) == ["ok"]
    settled = [e for e in events if e.type == "approval.settled"]
    assert [e.data["decision"] for e in settled] == ["approve"]
    assert events[-1].type == "session.waiting"


def test_chat_deny_with_a_reason_reaches_the_model(
    url: str, children: list[pexpect.spawn[str]]
) -> None:
    child = chat(url, children)
    session_id = ask_refund(child)
    child.sendline("n")
    child.expect_exact("Reason")
    child.sendline("we already shipped a replacement")
    child.expect_exact("support:")
    child.expect_exact(
        "I couldn't issue the refund: it was declined (we already shipped a replacement)."
    )
    # Small refunds need no approval: no prompt, the tool runs straight away.
    child.expect_exact("you:")
    child.sendline("refund order 1043")
    child.expect_exact("Done. I've refunded 45.00 for order 1043")
    finish(child)

    events = log(url, session_id)
    assert refund_results(events) == ["denied", "ok"]
    denied = next(e for e in events if e.type == "tool.completed" and e.data["status"] == "denied")
    assert denied.data["result"]["reason"] == "we already shipped a replacement"


def test_a_prompt_left_open_is_answered_by_another_process(
    url: str, children: list[pexpect.spawn[str]]
) -> None:
    child = chat(url, children)
    session_id = ask_refund(child)
    child.sendeof()  # walk away: the request stays pending in the store
    child.expect(r"left (req_\w+) pending")
    request_id = group(child)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    queue = CliRunner().invoke(app, ["pending", "--store", url, "--json"])
    rows = json.loads(queue.stdout)
    assert [r["id"] for r in rows] == [request_id]
    assert rows[0]["session_id"] == session_id

    follower = spawn("events", session_id, "--follow", "--store", url)
    children.append(follower)
    follower.expect_exact("turn.waiting")

    done = subprocess.run(
        [SIGNOFF, "approve", request_id, "examples.support:runtime", "--store", url]
        + ["--reason", "receipt checked"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert f"approved {request_id}" in done.stdout
    assert (
        "support: Done. I've refunded 180.00 for order 1042 to the original payment method "
        "(approved: receipt checked)." in " ".join(done.stdout.split())
    )

    # The follower sees the live events written by the other process.
    follower.expect_exact("approval.settled")
    follower.expect_exact('issue_refund -> {"order_id":"1042","refunded":180} (approved: receipt')
    follower.expect_exact("turn.completed")
    follower.sendintr()
    follower.expect(pexpect.EOF)
    follower.close()
    assert follower.exitstatus == 0
    assert refund_results(log(url, session_id)) == ["ok"]


def test_chat_resumes_a_session_whose_answer_was_recorded_elsewhere(
    url: str, children: list[pexpect.spawn[str]]
) -> None:
    child = chat(url, children)
    session_id = ask_refund(child)
    child.sendeof()
    child.expect(r"left (req_\w+) pending")
    request_id = group(child)
    child.expect(pexpect.EOF)
    child.close()

    # Record the decision only (no runtime): nothing runs until a process with the agent resumes.
    recorded = CliRunner().invoke(app, ["approve", request_id, "--store", url])
    assert recorded.exit_code == 0, recorded.output
    assert f"--session {session_id}" in recorded.stdout
    assert refund_results(log(url, session_id)) == []

    resumed = chat(url, children, "--session", session_id)
    resumed.expect_exact("Done. I've refunded 180.00 for order 1042")
    finish(resumed)
    assert refund_results(log(url, session_id)) == ["ok"]


def test_chat_asks_a_question_as_numbered_choices(
    url: str, children: list[pexpect.spawn[str]]
) -> None:
    child = spawn("chat", "tests._cli:sizer", "--store", url)
    children.append(child)
    child.expect_exact("you:")
    child.sendline("I want coffee")
    child.expect_exact("Which size?")
    child.expect_exact("1. Small")
    child.expect_exact("2. Large")
    child.expect_exact("(1-2 or your answer):")
    child.sendline("2")
    child.expect_exact("sizer:")
    child.expect_exact("You chose Large.")
    finish(child)


def test_the_example_talks_to_a_configured_provider(
    url: str, children: list[pexpect.spawn[str]]
) -> None:
    with FakeLLM("openai") as llm:
        call = {"order_id": "1042", "amount": 180, "reason": "Arrived broken"}
        llm.queue(
            openai_completion(tool_calls=[openai_tool_call("call_1", "issue_refund", call)]),
            openai_completion("Your refund of 180.00 is on its way."),
        )
        child = spawn(
            "chat",
            "examples.support:runtime",
            "--store",
            url,
            OPENAI_BASE_URL=llm.base_url,
            OPENAI_API_KEY=API_KEY,
        )
        children.append(child)
        child.expect_exact(f"model: OpenAIChat('gpt-4.1-mini', base_url='{llm.base_url}')")
        child.expect_exact("you:")
        child.sendline("my espresso machine arrived broken, order 1042")
        child.expect(re.escape('Run issue_refund({"order_id":"1042","amount":180,') + r".*\(y/N\)")
        child.sendline("y")
        child.expect_exact("Your refund of 180.00 is on its way.")
        finish(child)
    first, second = llm.bodies
    assert first["model"] == "gpt-4.1-mini"
    assert first["messages"][-1]["content"] == "my espresso machine arrived broken, order 1042"
    assert {t["function"]["name"] for t in first["tools"]} == {
        "lookup_order",
        "issue_refund",
        "delete_account",
        "ask_question",
    }
    result = second["messages"][-1]
    assert result["role"] == "tool"
    assert result["tool_call_id"] == "call_1"
    assert "180" in result["content"]


# -- TerminalChannel on its own ---------------------------------------------------------------


def _request(**fields: object) -> so.InputRequest:
    base: dict[str, object] = {
        "kind": "tool-approval",
        "id": "req_1",
        "session_id": "ses_1",
        "turn_id": "trn_1",
        "agent": "support",
        "action": so.Action(
            call_id="call_1",
            tool_name="issue_refund",
            input={"order_id": "1042", "amount": 180.0},
            input_hash="sha256:x",
        ),
        "created_at": 0.0,
    }
    base.update(fields)
    return so.InputRequest.model_validate(base)


def _channel(answers: list[str | None]) -> tuple[TerminalChannel, list[str], Console]:
    console = Console(record=True, width=120, file=open(os.devnull, "w"))
    prompts: list[str] = []

    def read(prompt: str) -> str | None:
        prompts.append(prompt)
        return answers.pop(0)

    return TerminalChannel(console, read=read), prompts, console


def test_channel_approves_on_y() -> None:
    channel, prompts, console = _channel(["  Y "])
    try:
        answer = channel.ask(_request())
    finally:
        console.file.close()
    assert answer == so.InputResponse(request_id="req_1", option_id="approve")
    assert 'Run issue_refund({"order_id":"1042","amount":180})?' in prompts[0]
    assert "(y/N)" in prompts[0]


@pytest.mark.parametrize(
    ("typed", "option"),
    [("ｙｅｓ", "approve"), ("Ｎ", "cancel"), ("yes\u200b", "approve"), ("\u200fn", "cancel")],
)
def test_channel_reads_a_full_width_yes_or_no_as_the_text_channel_does(
    typed: str, option: str
) -> None:
    """An input method's wide mode types `ｙｅｓ`: the text channel folds it (NFKC, casefold)
    into `yes`, and the terminal took it for nonsense and asked again; so too `yes` with a
    zero-width space, or `n` after a right-to-left mark (what draws nothing is passed over)."""
    channel, prompts, console = _channel([typed, ""])
    try:
        assert channel.ask(_request()) == so.InputResponse(request_id="req_1", option_id=option)
    finally:
        console.file.close()
    assert "answer y or n" not in console.export_text()


@pytest.mark.parametrize("typed", ["y\udcff", "\udcffyes", "1\udcff"])
def test_channel_refuses_a_line_holding_a_byte_not_utf8(typed: str) -> None:
    """A byte that is not UTF-8, piped in (Python's lone surrogate), was passed over as if it
    drew nothing: `y` and it approved the call, `1` and it chose the first option. The line is
    refused and asked again, as any other the prompt does not take."""
    question = _request(
        kind="question", action=None, question="Which?", options=[so.Option(id="s", label="S")]
    )
    asked = typed.startswith("1")
    channel, prompts, console = _channel([typed, "S"] if asked else [typed, "no", ""])
    try:
        answer = channel.ask(question if asked else _request())
        then = "s" if asked else "cancel"  # what the line after it says
        assert answer == so.InputResponse(request_id="req_1", option_id=then)
        assert ("choose 1" if asked else "answer y or n") in console.export_text()
    finally:
        console.file.close()


def test_channel_denies_by_default_and_asks_why() -> None:
    channel, prompts, console = _channel(["", "too much"])
    try:
        answer = channel.ask(_request())
        assert answer == so.InputResponse(request_id="req_1", option_id="cancel", text="too much")
        channel2, _, console2 = _channel(["no", ""])
        try:
            assert channel2.ask(_request()) == so.InputResponse(
                request_id="req_1", option_id="cancel"
            )
        finally:
            console2.file.close()
    finally:
        console.file.close()
    assert "Reason" in prompts[1]


def test_channel_repeats_on_nonsense_and_none_at_end_of_input() -> None:
    channel, prompts, console = _channel(["maybe", "yes"])
    try:
        assert channel.ask(_request()) is not None
        assert "answer y or n" in console.export_text()
        assert len(prompts) == 2
        eof, _, console2 = _channel([None])
        try:
            assert eof.ask(_request()) is None
        finally:
            console2.file.close()
    finally:
        console.file.close()


def test_channel_shows_a_tool_payload() -> None:
    channel, _, console = _channel(["y"])
    try:
        channel.ask(_request(payload={"action": "refund", "amount": 99.5}, source="tool"))
        assert 'issue_refund asks for approval: {"action":"refund","amount":99.5}' in (
            console.export_text()
        )
    finally:
        console.file.close()


def test_channel_shows_review_quorum_and_deadline() -> None:
    console = Console(record=True, width=120, file=open(os.devnull, "w"))
    try:
        channel = TerminalChannel(console, read=lambda prompt: "y", clock=lambda: 1000.0)
        request = _request(
            auto_verdict="caution",
            auto_reason="large amount",
            approvers=2,
            approved_by=["alice"],
            expires_at=1000.0 + 2 * 3600 + 5,
            on_timeout="escalate",
            policy_error="KeyError: 'tenant'",
        )
        assert channel.ask(request) == so.InputResponse(request_id="req_1", option_id="approve")
        text = console.export_text()
    finally:
        console.file.close()
    assert "auto review said caution: large amount" in text
    assert "the approval policy failed (KeyError: 'tenant'); asking you instead" in text
    assert "needs 2 approvals; approved by alice" in text
    assert "expires in 2h; then it is escalated" in text


def test_channel_answers_a_question_by_number_label_or_text() -> None:
    question = _request(
        kind="question",
        action=None,
        question="Which size?",
        options=[so.Option(id="s", label="Small"), so.Option(id="l", label="Large")],
        allow_text=True,
    )
    for typed, expected in (
        ("2", so.InputResponse(request_id="req_1", option_id="l")),
        ("small", so.InputResponse(request_id="req_1", option_id="s")),
        ("the three-pack", so.InputResponse(request_id="req_1", text="the three-pack")),
    ):
        channel, _, console = _channel([typed])
        try:
            assert channel.ask(question) == expected
            assert "1. Small" in console.export_text()
        finally:
            console.file.close()
    strict = question.model_copy(update={"allow_text": False})
    channel, prompts, console = _channel(["7", "1"])
    try:
        assert channel.ask(strict) == so.InputResponse(request_id="req_1", option_id="s")
        assert "choose 1-2" in console.export_text()
    finally:
        console.file.close()


def test_compact_json_reads_like_helix() -> None:
    assert compact_json({"amount": 180.0, "x": [1.5, 2.0]}) == '{"amount":180,"x":[1.5,2]}'


def test_compact_json_shows_invisible_characters_as_escapes_and_still_parses() -> None:
    """A zero-width space, a tag character or a bidirectional mark in a tool input is shown as
    its escape, in keys too; visible non-ASCII text stays as it is, and the text parses back."""
    value = {"to\u200b": "ACME\U000e0061\u061c", "note": "café 返金"}
    shown = compact_json(value)
    assert shown == '{"to\\u200b":"ACME\\udb40\\udc61\\u061c","note":"café 返金"}'
    assert json.loads(shown) == value


def test_channel_takes_odd_digits_as_text_not_a_crash() -> None:
    """A superscript digit or thousands of digits are no option number: they are the answer."""
    question = _request(
        kind="question",
        action=None,
        question="Which size?",
        options=[so.Option(id="s", label="Small"), so.Option(id="l", label="Large")],
        allow_text=True,
    )
    for typed in ("²", "9" * 5000):
        channel, _, console = _channel([typed])
        try:
            assert channel.ask(question) == so.InputResponse(request_id="req_1", text=typed)
        finally:
            console.file.close()


def test_channel_refuses_an_ambiguous_or_invisible_answer() -> None:
    """`2` names option a by label and option b by number: the terminal picks neither (as the
    text channels do) and asks again; a zero-width space is no answer either."""
    question = _request(
        kind="question",
        action=None,
        question="Which?",
        options=[so.Option(id="a", label="2"), so.Option(id="b", label="x")],
        allow_text=True,
    )
    channel, prompts, console = _channel(["2", "\u200b", "b"])
    try:
        assert channel.ask(question) == so.InputResponse(request_id="req_1", option_id="b")
        assert "more than one option" in console.export_text()
        assert len(prompts) == 3
    finally:
        console.file.close()


def test_a_deadline_centuries_away_reads_in_years_not_hundreds_of_digits() -> None:
    """`expires_in=1e300` is a valid deadline: its time left was printed as a number of days
    three hundred digits long, in `signoff chat` and `signoff queue`; it reads in years, and
    past 9999 of them as "over 9999y" (as the dashboard shows such a date "after 9999-12-31")."""
    from signoff.channels.terminal import duration

    assert [duration(s) for s in (45, 720, 3 * 3600, 2 * 86400, 36499 * 86400)] == [
        "45s",
        "12m",
        "3h",
        "2d",
        "36499d",
    ]
    year = 365.25 * 86400
    assert duration(100 * year) == "100y"
    assert duration(1e12) == "over 9999y"  # 31,688 years
    assert duration(9999 * year + 1) == "9999y"
    assert duration(10000 * year) == "over 9999y"
    assert duration(1e300) == "over 9999y"
    console = Console(record=True, width=120, file=open(os.devnull, "w"))
    try:
        channel = TerminalChannel(console, read=lambda prompt: "y", clock=lambda: 1000.0)
        channel.ask(_request(expires_at=1e300))
        text = console.export_text()
    finally:
        console.file.close()
    assert "expires in over 9999y; then it is denied" in text


def _unstyled(markup: str) -> str:
    for tag in ("[red]", "[bold]", "[dim]", "[/]"):
        markup = markup.replace(tag, "")
    return markup


@pytest.mark.parametrize("text", ["a\\", "a\\\\", "a\\\\\\", "\\", "[b]x\\\\", "x\\[/]\\"])
@pytest.mark.parametrize("around", ["{}", "[red]{}[/]", "{}[bold]y[/]", "[dim]{} z[/]"])
def test_printable_keeps_backslashes_at_its_end_whatever_markup_follows(
    text: str, around: str
) -> None:
    """Backslashes ending a text print as they are, and the markup around it stays markup: Rich
    read a run of them as escaping the tag after it (or printed one too many at the end)."""
    from signoff.channels.terminal import printable

    before, after = around.split("{}")
    console = Console(highlight=False, width=200)
    with console.capture() as captured:
        console.print(before + printable(text) + after, end="")
    assert captured.get() == _unstyled(before) + text + _unstyled(after)


def test_a_huge_input_is_cut_in_the_prompt_and_v_shows_all_of_it() -> None:
    """A 200 KB argument (and a 50 KB payload) printed whole before `(y/N)` filled thousands of
    lines of the terminal, the prompt lost at their end. Each is cut, saying how much is left
    out, and `v` at the prompt prints all of both, then asks again: what is approved is there
    to read."""
    blob = "y" * 200_000
    payload = {"note": "p" * 50_000}
    console = Console(record=True, width=120, file=open(os.devnull, "w"))
    prompts: list[str] = []
    printed: list[str] = []
    answers = ["v", "y"]

    def read(prompt: str) -> str | None:
        prompts.append(prompt)
        printed.append(console.export_text(clear=True))
        return answers.pop(0)

    action = so.Action(call_id="c", tool_name="upload", input={"blob": blob}, input_hash="h")
    try:
        answer = TerminalChannel(console, read=read).ask(
            _request(action=action, payload=payload, source="tool")
        )
    finally:
        console.file.close()
    assert answer == so.InputResponse(request_id="req_1", option_id="approve")
    first = printed[0] + prompts[0]
    assert len(first) < 5_000, "the first screen is the whole input"
    assert "Run upload(" in prompts[0] and "(y/N, v shows all of it)" in prompts[0]
    assert f"{len(compact_json({'blob': blob})) - 1000:,} more characters" in prompts[0]
    assert "more characters" in printed[0]  # the payload's line, cut too
    assert compact_json({"blob": blob}) in printed[1]
    assert compact_json(payload) in printed[1]
    assert "Run upload(" in prompts[1]


def test_a_short_input_is_shown_whole_with_no_hint_to_see_more() -> None:
    channel, prompts, console = _channel(["y"])
    try:
        channel.ask(_request())
    finally:
        console.file.close()
    assert prompts[0].endswith("[dim](y/N)[/] ")
    assert "more characters" not in prompts[0]
