"""`signoff delete` (`_deletion`): a finished session erased with its audit entry, a live one
refused with nothing changed, and the confirmation asked at a terminal."""

from __future__ import annotations

import asyncio
import importlib
import io
import os
import pty
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import signoff as so
from signoff.channels import TerminalChannel
from signoff.cli import _deletion, app
from signoff.testing import ManualClock, reply, scripted_agent

from ._audit import alter
from ._cli import ROOT, invoke, log, park, refused_usage, url
from .test_cli_interrupts import _read_until, _wait_until_blocked
from .test_deletion_expired_tree import nested_desks

__all__ = ["url"]  # the fixture, used by name


def _finished(url: str) -> str:
    """A session whose turn completed: the id."""
    with so.Runtime([scripted_agent("greeter", [reply("hello")])], store=url) as rt:
        return rt.generate_sync("greeter", "hi").session_id


def _deletions(url: str, damaged: tuple[str, ...] = ()) -> list[dict[str, object]]:
    """The deletions recorded, the trail verifying clean but for the sessions `damaged`."""
    with so.Runtime([], store=url) as rt:
        assert [p.stream for p in rt.verify_audit_sync()] == list(damaged)
        return [e.data for e in rt.audit_sync(stream="store:deletions")]


def test_delete_erases_a_finished_session_and_records_who_and_why(url: str) -> None:
    session_id = _finished(url)
    result = invoke("delete", session_id, "--store", url, "--yes", "--reason", "GDPR erasure")
    assert result.exit_code == 0, result.output
    assert f"deleted {session_id}; recorded in the audit trail" in result.stdout
    with so.Runtime([], store=url) as rt, pytest.raises(so.UnknownSession):
        rt.state_sync(session_id)
    (entry,) = _deletions(url)
    assert entry["session_id"] == session_id and entry["reason"] == "GDPR erasure"
    assert entry["by"] == so.cli.local_principal().model_dump()
    again = invoke("delete", session_id, "--store", url, "--yes")
    assert again.exit_code == 1 and "UnknownSession" in again.stderr


def test_delete_records_the_principal_given_with_as(url: str) -> None:
    session_id = _finished(url)
    result = invoke("delete", session_id, "--store", url, "-y", "--as", "oidc:dpo@example.com")
    assert result.exit_code == 0, result.output
    (entry,) = _deletions(url)
    by = entry["by"]
    assert isinstance(by, dict) and by["principal_id"] == "dpo@example.com"


def test_delete_by_a_local_user_whose_name_is_not_utf8_records_it_escaped(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user name of a byte not UTF-8 (read as a lone surrogate) was refused as `by`; the
    deletion's entry holds it escaped, as a dashboard sign-out's, and the trail verifies."""
    session_id = _finished(url)
    monkeypatch.setenv("LOGNAME", "o\udcff")  # what getpass reads first: the byte 0xff
    result = invoke("delete", session_id, "--store", url, "--yes")
    assert result.exit_code == 0, result.output
    (entry,) = _deletions(url)
    by = entry["by"]
    assert isinstance(by, dict) and by["principal_id"] == "o\\udcff"


def test_delete_refuses_a_session_waiting_on_people_and_changes_nothing(url: str) -> None:
    session_id, request_id = park(url)
    result = invoke("delete", session_id, "--store", url, "--yes")
    assert result.exit_code == 1, result.output
    assert "SessionWaiting" in result.stderr and "cancel it first" in result.stderr
    with so.Runtime([], store=url) as rt:
        assert [r.id for r in rt.pending_sync(session_id=session_id)] == [request_id]
    assert _deletions(url) == []


def test_delete_without_a_terminal_needs_yes(url: str) -> None:
    session_id = _finished(url)
    message = refused_usage(invoke("delete", session_id, "--store", url))
    assert "no terminal to ask for confirmation at: pass --yes" in message
    with so.Runtime([], store=url) as rt:
        assert rt.state_sync(session_id).status == "idle"


def test_delete_asks_at_a_terminal_and_no_keeps_the_session(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_deletion, "_can_ask", lambda: True)
    session_id = _finished(url)
    kept = CliRunner().invoke(app, ["delete", session_id, "--store", url], input="n\n")
    assert kept.exit_code == 1, kept.output
    assert f"Delete session {session_id} (greeter, idle, " in kept.stdout
    assert "Nothing deleted." in kept.stdout
    assert _deletions(url) == []
    gone = CliRunner().invoke(app, ["delete", session_id, "--store", url], input="y\n")
    assert gone.exit_code == 0, gone.output
    assert len(_deletions(url)) == 1


def test_delete_refuses_an_empty_id_and_a_missing_store(url: str, tmp_path: object) -> None:
    assert "SESSION_ID is empty" in refused_usage(invoke("delete", "", "--store", url, "--yes"))
    missing = invoke("delete", "ses_x", "--store", "sqlite:////nonexistent/dir/s.db", "--yes")
    assert missing.exit_code != 0 and "Traceback" not in missing.output


@pytest.mark.parametrize("command", ["delete", "prune"])
def test_one_ctrl_c_at_the_confirmation_ends_delete_and_deletes_nothing(
    url: str, command: str
) -> None:
    """Ctrl-C at `signoff delete`'s (or `prune`'s) question in a terminal ends it at once, 130
    and one line, the session kept: the question was read in the command's event loop, where
    asyncio's handler only cancelled the task, so Ctrl-C did nothing until Enter (and a `y`
    typed then went on)."""
    session_id = _finished(url)
    terminal, tty = pty.openpty()
    args = [session_id] if command == "delete" else ["--older-than", "0s"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", command, *args, "--store", url],
        cwd=ROOT,
        stdin=tty,
        stdout=tty,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    os.close(tty)
    try:
        _read_until(terminal, b"[y/N]")
        _wait_until_blocked(proc.pid)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        os.close(terminal)
    assert proc.returncode == 130, stderr
    assert stderr.decode().strip() == "interrupted"
    assert _deletions(url) == []


def test_the_confirmation_asks_again_at_another_answer_and_keeps_the_session_at_end_of_input(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_deletion, "_can_ask", lambda: True)
    session_id = _finished(url)
    kept = CliRunner().invoke(app, ["delete", session_id, "--store", url], input="maybe\n")
    assert kept.exit_code == 1, kept.output
    assert "answer y or n" in kept.stdout and "Nothing deleted." in kept.stdout
    assert _deletions(url) == []
    gone = CliRunner().invoke(app, ["delete", session_id, "--store", url], input="x\nYes\n")
    assert gone.exit_code == 0, gone.output
    assert len(_deletions(url)) == 1


def test_delete_force_erases_a_damaged_session_a_cancel_cannot_finish(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session whose log a hand edit broke (an event gone) cannot be read, so not cancelled,
    nor deleted unfinished: `--force` deletes it, the question saying it is damaged rather
    than failing to read it."""
    monkeypatch.setattr(_deletion, "_can_ask", lambda: True)
    session_id, _ = park(url)
    alter(url, "DELETE FROM {t}events WHERE seq = 2")
    refused = invoke("delete", session_id, "--store", url, "--yes")
    assert refused.exit_code == 1 and "damaged" in refused.stderr, refused.output
    assert _deletions(url, damaged=(session_id,)) == []  # verification names the gap
    asked = CliRunner().invoke(app, ["delete", session_id, "--store", url, "--force"], input="n\n")
    assert asked.exit_code == 1, asked.output
    assert f"Delete session {session_id} (damaged: " in asked.stdout
    assert _deletions(url, damaged=(session_id,)) == []
    gone = invoke("delete", session_id, "--store", url, "--yes", "--force", "--reason", "broken")
    assert gone.exit_code == 0, gone.output
    (entry,) = _deletions(url)
    assert entry["force"] is True and entry["reason"] == "broken"


@pytest.mark.parametrize("command", ["delete", "prune"])
def test_with_standard_input_closed_deleting_asks_for_yes(url: str, command: str) -> None:
    """`<&-` (Python's stdin None) was an AttributeError traceback, exit 1: no terminal to ask
    at, as for /dev/null, is exit 2 naming --yes, and nothing is deleted."""
    session_id = _finished(url)
    args = [session_id] if command == "delete" else ["--older-than", "0s"]
    done = subprocess.run(
        [sys.executable, "-m", "signoff", command, *args, "--store", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.close(0),
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "pass --yes" in done.stderr and "Traceback" not in done.stderr
    assert _deletions(url) == []


def test_delete_with_the_runtime_answered_no_records_no_passed_ttl(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`delete SESSION_ID MODULE:RUNTIME` read the session for its question through the loaded
    runtime, which recorded the TTL that had passed with nothing recording it (its request
    expired, the turn failed) before asking: an answer of no left two events more. The question
    shows the state as recorded, and only a yes writes."""
    monkeypatch.setattr(_deletion, "_can_ask", lambda: True)
    module = f"short_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text(
        "import signoff as so\nfrom tests._cli import agent\n"
        "short = so.Agent(name='support', model=agent.model, tools=list(agent.tools.values()), "
        "limits=so.Limits(ttl=60))\n"
        f"runtime = so.Runtime([short], store={store_url!r})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("SIGNOFF_STORE", raising=False)
    short = importlib.import_module(module).short
    with so.Runtime([short], store=store_url, clock=ManualClock(1_600_000_000)) as rt:
        session_id = rt.generate_sync("support", "Refund order 1042").session_id
    before = log(store_url, session_id)
    kept = CliRunner().invoke(app, ["delete", session_id, f"{module}:runtime"], input="n\n")
    assert kept.exit_code == 1, kept.output
    assert f"Delete session {session_id} (support, failed, " in kept.stdout
    assert "Nothing deleted." in kept.stdout
    assert log(store_url, session_id) == before
    assert _deletions(store_url) == []
    gone = CliRunner().invoke(app, ["delete", session_id, f"{module}:runtime"], input="y\n")
    assert gone.exit_code == 0, gone.output
    assert [e["session_id"] for e in _deletions(store_url)] == [session_id]


def test_the_confirmation_takes_no_yes_holding_a_byte_not_utf8(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`y` and a byte that is not UTF-8 (Python's lone surrogate) read as `y`: the byte was
    passed over as a character that draws nothing. It is asked again, as at `maybe`."""
    typed = io.TextIOWrapper(io.BytesIO(b"y\xff\nn\n"), errors="surrogateescape")
    monkeypatch.setattr(sys, "stdin", typed)
    console = Console(record=True, file=io.StringIO())

    async def ask() -> bool:  # in a command's event loop, as `delete` asks
        return _deletion._confirmed(TerminalChannel(console), "Delete it?")

    assert not asyncio.run(ask())
    assert "answer y or n" in console.export_text()


def _own_turn_waits(url: str) -> str:
    """A finished session whose subagent's own turn (a message sent to it) waits on a person:
    the session itself reads idle; its deletion is refused."""
    agents = nested_desks("front")
    with so.Runtime(agents, store=url) as rt:
        desk = rt.generate_sync("desk", "ask:where is order 3?").session_id
        [helper] = [s.id for s in rt.sessions_sync(agent="helper")]
        assert rt.generate_sync(session_id=helper, prompt="refund 6").pending
    return desk


@pytest.mark.parametrize("made", ["waiting", "subagent-waiting"])
def test_delete_says_it_is_refused_before_asking(
    url: str, made: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It asked "Delete session ... for good?" about a session it then refused all the same
    (`SessionWaiting`): a y was answered for nothing. Refused first now, nothing asked, nothing
    changed."""
    monkeypatch.setattr(_deletion, "_can_ask", lambda: True)
    session_id = park(url)[0] if made == "waiting" else _own_turn_waits(url)
    with so.Runtime([], store=url) as rt:
        ids = [s.id for s in rt.sessions_sync()]
    before = [log(url, s) for s in ids]
    result = CliRunner().invoke(app, ["delete", session_id, "--store", url], input="y\n")
    assert result.exit_code == 1, result.output
    assert "Delete session" not in result.stdout, result.output
    assert result.stderr.startswith(f"error: SessionWaiting: session {session_id!r} waits on ")
    assert len(result.stderr.splitlines()) == 1
    assert [log(url, s) for s in ids] == before
    assert _deletions(url) == []


def test_delete_asks_about_a_tree_its_passed_ttl_frees(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its TTL, a session waiting (under it a subagent, waiting on a person) is deleted,
    its expiry recorded first: asked about, not refused before the question; a no records
    nothing."""
    monkeypatch.setattr(_deletion, "_can_ask", lambda: True)
    with so.Runtime(nested_desks("front"), store=url, clock=ManualClock(1_600_000_000)) as rt:
        session_id = rt.generate_sync("front", "go").session_id
        ids = [s.id for s in rt.sessions_sync()]
    logs = [log(url, s) for s in ids]
    kept = CliRunner().invoke(app, ["delete", session_id, "--store", url], input="n\n")
    assert kept.exit_code == 1, kept.output
    assert f"Delete session {session_id} (front, failed, " in kept.stdout
    assert [log(url, s) for s in ids] == logs
    gone = CliRunner().invoke(app, ["delete", session_id, "--store", url], input="y\n")
    assert gone.exit_code == 0, gone.output
    assert [e["session_id"] for e in _deletions(url)] == [session_id]
